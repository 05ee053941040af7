"""``reward-server eval parl``: the PARL evaluation table (paper Table 1 shape) from files.

Inputs
  ``--rubrics R.jsonl``  one user per line: ``{"user_id": "u1", "rules": ["...", ...],
                        "task": "amazon"}`` (``task`` optional: generic|amazon|news|reddit;
                        ``rules`` may be empty: the user is not covered).
  ``--predictions DIR`` one ``<method>.jsonl`` per method, the ground truth in ``gt.jsonl``
                        (``--gt``), one test sample per line: ``{"user_id": "u1",
                        "text": "...", "context": "...", "sample_id": "s1"}`` (``context``
                        optional; ``sample_id`` optional, defaults to the user's n-th line).
                        Samples are paired across methods by (user_id, sample_id).
Outputs (``--out DIR``)
  ``parl_eval.json``    coverage, average rules, per method: user-level accuracy (all-or-
                        nothing), rubric-level accuracy pooled and per-sample mean, samples
                        scored; Max-Diff vs the best non-GT method with a paired t-test p;
                        judge model, template versions and threshold (provenance).
  ``parl_eval.png``     bar chart of user-level accuracy per method.
The table is printed on stdout; a progress bar runs on stderr while judging.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reward_server.backends.base import JudgeEngine, JudgePrompt
from reward_server.domain import Task
from reward_server.rubric import metrics
from reward_server.rubric.scoring import judge_batch
from reward_server.rubric.settings import RubricSettings
from reward_server.rubric.templates import judge_prompts, template_versions

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class UserRubric:
    rules: tuple[str, ...]
    task: Task


@dataclass(frozen=True)
class Sample:
    key: tuple[str, str]  # (user_id, sample_id)
    context: str
    text: str


def register(subparsers: Any) -> None:
    """Add the ``parl`` command to an argparse subparsers object."""
    p = subparsers.add_parser("parl", help="PARL evaluation table over rubrics and predictions")
    p.add_argument("--rubrics", required=True, type=Path, help="R.jsonl (see module doc)")
    p.add_argument("--predictions", required=True, type=Path, help="folder of <method>.jsonl")
    p.add_argument("--out", required=True, type=Path, help="output folder")
    p.add_argument("--gt", default="gt", help="method name of the ground truth (file gt.jsonl)")
    p.add_argument("--config", "-c", type=Path, help="YAML config file (judge backend, rubric settings)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set engines.judge.model=smollm2-local")  # fmt: skip
    p.add_argument("--chunk", type=int, default=16, help="samples per batched judge call")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG bar chart")
    p.set_defaults(fn=run_parl_eval)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
            if not isinstance(rec, dict) or not isinstance(rec.get("user_id"), str | int):
                raise ValueError(f"{path}:{n}: expected an object with a user_id")
            rows.append(rec)
    return rows


def read_rubrics(path: Path) -> dict[str, UserRubric]:
    out: dict[str, UserRubric] = {}
    for rec in _read_jsonl(path):
        rules = rec.get("rules", [])
        if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
            raise ValueError(f"{path}: user {rec['user_id']}: rules must be a list of strings")
        out[str(rec["user_id"])] = UserRubric(tuple(rules), Task(rec.get("task", "generic")))
    return out


def read_predictions(path: Path) -> list[Sample]:
    seen: dict[str, int] = {}
    samples = []
    for rec in _read_jsonl(path):
        uid = str(rec["user_id"])
        if not isinstance(rec.get("text"), str):
            raise ValueError(f"{path}: user {uid}: text must be a string")
        sid = str(rec.get("sample_id", seen.get(uid, 0)))
        seen[uid] = seen.get(uid, 0) + 1
        samples.append(Sample((uid, sid), str(rec.get("context", "")), rec["text"]))
    return samples


async def judge_samples(
    judge: JudgeEngine,
    rubrics: Mapping[str, UserRubric],
    samples: Sequence[Sample],
    *,
    chunk: int,
    on_progress: Callable[[int], None] | None = None,
) -> dict[tuple[str, str], list[float]]:
    """p_yes of every rule of the sample's user on the sample's text (empty: no rule)."""
    out: dict[tuple[str, str], list[float]] = {}
    for start in range(0, len(samples), chunk):
        part = samples[start : start + chunk]
        prompts: list[JudgePrompt] = []
        spans: list[tuple[tuple[str, str], int, int]] = []
        for s in part:
            ur = rubrics.get(s.key[0], UserRubric((), Task.GENERIC))
            spans.append((s.key, len(prompts), len(ur.rules)))
            prompts.extend(judge_prompts(s.context, s.text, ur.rules, ur.task))
        p = await judge_batch(judge, prompts)
        for key, at, n in spans:
            out[key] = p[at : at + n]
        if on_progress:
            on_progress(len(part))
    return out


def summarize(
    judged: Mapping[str, Mapping[tuple[str, str], Sequence[float]]],
    rubrics: Mapping[str, UserRubric],
    *,
    gt: str,
    threshold: float,
) -> dict[str, Any]:
    """Every metric of docs/parl.md §5 from judged samples per method."""
    rule_sets = {u: r.rules for u, r in rubrics.items()}
    methods: dict[str, dict[str, float]] = {}
    for name, table in judged.items():
        rows = list(table.values())
        rla = metrics.rubric_level_accuracy(rows, threshold)
        methods[name] = {
            "n_samples": float(len(rows)),
            "n_scored": float(sum(1 for r in rows if r)),
            "user_level_accuracy": metrics.user_level_accuracy(rows, threshold),
            "rubric_level_pooled": rla.pooled,
            "rubric_level_per_sample": rla.per_sample_mean,
        }
    result: dict[str, Any] = {
        "n_users": len(rubrics),
        "coverage_percent": metrics.user_coverage(rule_sets),
        "avg_valid_rules": metrics.average_valid_rules(rule_sets),
        "threshold": threshold,
        "methods": methods,
    }
    others = {m: v["user_level_accuracy"] for m, v in methods.items() if m != gt}
    if gt in judged and others:
        diff, best = metrics.max_diff(methods[gt]["user_level_accuracy"], others)
        keys = [k for k, v in judged[gt].items() if v and k in judged[best]]
        a = metrics.per_sample_user_level([judged[gt][k] for k in keys], threshold)
        b = metrics.per_sample_user_level([judged[best][k] for k in keys], threshold)
        p = metrics.paired_t_test_p(a, b)
        result["max_diff"] = {"value": diff, "best_method": best, "p_value": p, "significant": bool(p < 0.05)}
    return result


def format_table(result: Mapping[str, Any], gt: str) -> str:
    def pct(x: float) -> str:
        return "   n/a" if x != x else f"{100 * x:6.2f}"

    names = sorted(result["methods"], key=lambda m: (m != gt, m))
    width = max(8, *(len(n) for n in names))
    lines = [f"{'Method':<{width}}  User-acc  Rubric-acc(pooled)  Rubric-acc(per-sample)  Samples"]
    for n in names:
        m = result["methods"][n]
        lines.append(
            f"{(n + (' (GT)' if n == gt else '')):<{width}}  {pct(m['user_level_accuracy'])}    "
            f"{pct(m['rubric_level_pooled'])}              {pct(m['rubric_level_per_sample'])}"
            f"                  {int(m['n_scored'])}/{int(m['n_samples'])}"
        )
    lines.append(f"Coverage: {result['coverage_percent']:.1f}%   Avg valid rules/user: {result['avg_valid_rules']:.2f}")
    if "max_diff" in result:
        md = result["max_diff"]
        lines.append(
            f"Max-Diff: {100 * md['value']:.2f} pts vs {md['best_method']}  (paired t-test p={md['p_value']:.3g})"
        )
    return "\n".join(lines)


def plot(result: Mapping[str, Any], gt: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted(result["methods"], key=lambda m: (m != gt, m))
    vals = [100 * result["methods"][n]["user_level_accuracy"] for n in names]
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(names)), 3.5))
    ax.bar(names, [0 if v != v else v for v in vals], color=["tab:green" if n == gt else "tab:blue" for n in names])
    ax.set_ylabel("user-level accuracy (%)")
    ax.set_ylim(0, 100)
    ax.set_title("PARL rubric evaluation")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


async def evaluate(
    judge: JudgeEngine, rubrics: Mapping[str, UserRubric], predictions: Path, *, gt: str,
    settings: RubricSettings, chunk: int, progress: bool,
) -> dict[str, Any]:  # fmt: skip
    files = sorted(predictions.glob("*.jsonl"))
    if not any(f.stem == gt for f in files):
        raise ValueError(f"{predictions} has no {gt}.jsonl (the ground truth)")
    samples = {f.stem: read_predictions(f) for f in files}
    total = sum(len(s) for s in samples.values())
    bar: Any = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, desc="judging", unit="sample", file=sys.stderr)
    try:
        judged = {
            name: await judge_samples(judge, rubrics, s, chunk=chunk, on_progress=bar.update if bar else None)
            for name, s in samples.items()
        }
    finally:
        if bar is not None:
            bar.close()
    result = summarize(judged, rubrics, gt=gt, threshold=settings.threshold)
    result["judge_model"] = judge.model_id
    result["template_versions"] = template_versions(settings)
    return result


def _json_safe(x: Any) -> Any:
    """NaN (no sample to score) becomes null: strict JSON."""
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    return x


def run_parl_eval(args: argparse.Namespace) -> int:
    """Entry point of ``reward-server eval parl``; returns the exit code."""
    from reward_server.config import load_config
    from reward_server.serving import start_engines

    cfg = load_config(args.config, overrides=args.overrides)
    try:
        rubrics = read_rubrics(args.rubrics)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    engines = start_engines(cfg.engines, cfg.serving, require=("judge",))

    async def go() -> dict[str, Any]:
        try:
            return await evaluate(
                engines.judge, rubrics, args.predictions, gt=args.gt, settings=cfg.rubric,
                chunk=args.chunk, progress=not args.no_progress,
            )  # fmt: skip
        finally:
            await engines.close()

    try:
        result = asyncio.run(go())
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_json_safe(result), indent=2, allow_nan=False)
    (args.out / "parl_eval.json").write_text(text + "\n", encoding="utf-8")
    if not args.no_plot:
        plot(result, args.gt, args.out / "parl_eval.png")
    print(format_table(result, args.gt))
    return 0
