"""Held-out evaluation of a TRL run: the reward on prompts of users the policy never trains on.

TRL's own evaluation loop does the work (``GRPOConfig.eval_strategy="steps"``, ``eval_on_start``):
it samples ``num_generations_eval`` completions of every prompt of the eval set (the prepared
``trl_val.parquet``: ``python -m trainer.data.prepare --val-size N`` holds out the last N users
of each source) with the training's sampling settings and scores them through the same reward
function; the reward transforms of control arms (:mod:`trainer.reward_transforms`) never apply
to it. :func:`heldout_trainer` adds what TRL does not log:

* ``eval_heldout_mean``: the mean over prompts of each prompt's mean reward;
* ``eval_heldout_se``: its standard error over the sampling, prompts held fixed (stratified:
  ``sqrt(sum_p s_p^2 / n_p) / P``, ``s_p`` the sample standard deviation of prompt p's ``n_p``
  rewards): the error bar for comparing two policies on THIS held-out set;
* ``eval_heldout_prompts`` and ``eval_heldout_samples``

(in one process; under ``accelerate launch`` with several, each holds a share of the groups
and only TRL's own ``eval_reward`` is logged);

and writes every scored completion to ``<run dir>/heldout/step-<N>.jsonl`` (``user_id``,
``index``, ``prompt``, ``completion``, ``reward``), so what changed in the texts can be read.

verl runs validate the same way (the presets' ``val_kwargs`` sample as training does, several
completions per prompt; ``trainer/run.py`` points verl's ``trainer.validation_data_dir`` at
``<run dir>/heldout``, where verl writes ``<N>.jsonl`` with ``input``, ``output``, ``score``,
``uid``). :func:`summarize` reads either engine's files and gives the same statistics:
``python -m trainer.heldout RUN_DIR/heldout``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class HeldOut:
    """One evaluation's held-out reward: mean of the prompts' means and its standard error."""

    mean: float
    se: float
    prompts: int
    samples: int


def stratified_mean_se(groups: Mapping[Any, Sequence[float]]) -> tuple[float, float]:
    """(mean of the groups' means, its standard error with the groups held fixed); every group
    needs two finite values or more."""
    if not groups:
        raise ValueError("no groups: nothing to average")
    means, variances = [], []
    for key, values in groups.items():
        v = [float(x) for x in values if math.isfinite(x)]
        if len(v) < 2:
            raise ValueError(f"group {key!r} has {len(v)} finite values; a standard error needs 2 or more")
        m = sum(v) / len(v)
        means.append(m)
        variances.append(sum((x - m) ** 2 for x in v) / (len(v) - 1) / len(v))
    return sum(means) / len(means), math.sqrt(sum(variances)) / len(means)


def message_text(completion: Any) -> str:
    """A prompt's or completion's text: the last message's content for a conversation."""
    if isinstance(completion, list) and completion and isinstance(completion[-1], Mapping):
        return str(completion[-1].get("content") or "")
    return str(completion)


def prompt_key(sample: Mapping[str, Any]) -> str:
    """The prompt a scored completion belongs to: its row's user and index (prepared data),
    else the prompt's text."""
    if sample.get("user_id") is not None:
        return f"{sample['user_id']}/{sample.get('index')}"
    return str(sample.get("prompt"))


def heldout_trainer(base: type[Any], *, out_dir: Path) -> type[Any]:
    """``base`` (a ``GRPOTrainer`` class) logging the held-out statistics of each evaluation
    (module doc) and writing its completions under ``out_dir / "heldout"``."""

    class HeldOutGRPOTrainer(base):  # type: ignore[misc]
        _heldout: list[dict[str, Any]] | None = None
        beta: float  # GRPOTrainer's KL coefficient

        def _calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, *args: Any,
                               **kwargs: Any) -> Any:
            rewards = super()._calculate_rewards(inputs, prompts, completions, *args, **kwargs)
            if self._heldout is not None and not self.model.training:
                total = (rewards * self.reward_weights.to(rewards.device)).sum(dim=1).tolist()
                for i, (row, prompt, completion) in enumerate(zip(inputs, prompts, completions, strict=True)):
                    extra = json.loads(row.get("extra_info_json") or "{}")
                    self._heldout.append({"user_id": extra.get("user_id"), "index": extra.get("index"),
                                          "prompt": message_text(prompt),
                                          "completion": message_text(completion), "reward": total[i]})
            return rewards

        def prediction_step(self, model: Any, inputs: Any, prediction_loss_only: bool,
                            ignore_keys: list[str] | None = None) -> tuple[None, None, None]:
            """Generate and score only: TRL's own also runs the reference model (``beta > 0``)
            and the policy again for an eval loss that says nothing about the held-out reward
            (two forwards of every completion, most of an evaluation's time on a CPU)."""
            beta = self.beta
            self.beta = 0.0  # read by _generate_and_score_completions alone: no reference forward
            try:
                self._prepare_inputs(inputs)
            finally:
                self.beta = beta
            return None, None, None

        def evaluation_loop(self, *args: Any, **kwargs: Any) -> Any:
            if self.accelerator.num_processes > 1:  # each process holds a share of the groups
                return super().evaluation_loop(*args, **kwargs)
            self._heldout = []
            try:
                output = super().evaluation_loop(*args, **kwargs)
                samples = self._heldout
            finally:
                self._heldout = None
            groups: defaultdict[str, list[float]] = defaultdict(list)
            for s in samples:
                groups[prompt_key(s)].append(s["reward"])
            if groups and all(len(v) >= 2 for v in groups.values()):
                mean, se = stratified_mean_se(groups)
                metrics = self._metrics["eval"]
                metrics["heldout_mean"].append(mean)
                metrics["heldout_se"].append(se)
                metrics["heldout_prompts"].append(float(len(groups)))
                metrics["heldout_samples"].append(float(len(samples)))
            if self.accelerator.is_main_process and samples:
                folder = Path(out_dir) / "heldout"
                folder.mkdir(parents=True, exist_ok=True)
                with (folder / f"step-{self.state.global_step}.jsonl").open("w", encoding="utf-8") as fh:
                    for s in samples:
                        fh.write(json.dumps(s, ensure_ascii=False) + "\n")
            return output

    return HeldOutGRPOTrainer


def read_dump(path: Path) -> dict[str, list[float]]:
    """The rewards of one evaluation's file, by prompt: a TRL ``step-<N>.jsonl`` (prompt =
    ``user_id`` and ``index``) or a verl validation dump ``<N>.jsonl`` (prompt = the row's uid,
    the part of verl's ``{uid}_{sample}_{output}`` key before the sample; else the prompt text)."""
    groups: defaultdict[str, list[float]] = defaultdict(list)
    with Path(path).open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            row = json.loads(line)
            if "reward" in row:  # ours (TRL)
                key, value = prompt_key(row), row["reward"]
            elif "score" in row:  # verl's _write_generations
                uid = str(row.get("uid") or "")
                parts = uid.rsplit("_", 2)
                key = parts[0] if len(parts) == 3 else str(row.get("input"))
                value = row["score"]
            else:
                raise ValueError(f"{path}:{n}: neither 'reward' (TRL) nor 'score' (verl) in the row")
            groups[key].append(float(value) if value is not None else math.nan)
    return dict(groups)


def summarize(folder: Path) -> dict[int, HeldOut]:
    """Every evaluation in a run's ``heldout/`` folder (either engine's files), by step."""
    out: dict[int, HeldOut] = {}
    for path in Path(folder).glob("*.jsonl"):
        m = re.fullmatch(r"(?:step-)?(\d+)\.jsonl", path.name)
        if not m:
            continue
        groups = read_dump(path)
        mean, se = stratified_mean_se(groups)
        out[int(m.group(1))] = HeldOut(mean=mean, se=se, prompts=len(groups),
                                       samples=sum(len(v) for v in groups.values()))
    return dict(sorted(out.items()))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.heldout",
                                 description="Held-out reward per evaluation of a TRL or verl run.")
    ap.add_argument("folder", type=Path, help="the run's heldout/ folder")
    args = ap.parse_args(argv)
    try:
        table = summarize(args.folder)
    except (OSError, ValueError) as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    if not table:
        sys.stderr.write(f"error: no evaluations (step-N.jsonl or N.jsonl) in {args.folder}\n")
        return 2
    first = next(iter(table.values()))
    sys.stdout.write(f"{'step':>5} {'held-out reward':>16} {'se':>7} {'vs first':>9} {'prompts':>7} "
                     f"{'samples':>7}\n")
    for step, h in table.items():
        diff_se = math.sqrt(h.se ** 2 + first.se ** 2)
        z = (h.mean - first.mean) / diff_se if diff_se > 0 else 0.0
        sys.stdout.write(f"{step:>5} {h.mean:>16.4f} {h.se:>7.4f} {z:>+8.1f}σ {h.prompts:>7} {h.samples:>7}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
