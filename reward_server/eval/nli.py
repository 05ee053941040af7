"""``reward-server eval nli``: NLICV's comparisons from files (formats: docs/evaluation.md).

``--input items.jsonl`` (``{"id"?, "response", "answer", "preference", "regime"?}`` per line):
the NLI verifier's regimes, confusion matrix and Mean Acc (Tables 2-3 shape) and, when
``engines.judge`` is set, the same for the LLM-as-judge baseline
(:mod:`reward_server.nli.llm_judge`), with the cost per item of each.

``--pairs pairs.jsonl`` (``{"id"?, "response", "reference", "label": positive|negative}``):
Table 1's robustness experiment, the NLI verifier and every classic metric before and after
a seeded synonym perturbation (:mod:`reward_server.eval.robustness`).

Outputs in ``--out`` (named as every eval command's, :func:`reward_server.eval.common.output`):
``nli_eval.json`` (the source of truth), ``nli_samples.jsonl`` (per item: verifier S_c, S_a,
regime, truncation, evidence with ``--evidence``, the judge's answer), ``nli_confusion.png`` and
``nli_robustness.png`` rendered from the JSON; the tables go to stdout. (Before, these were
``summary.json``, ``results.jsonl``, ``confusion.png``, ``robustness.png``.)
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reward_server.backends.base import JudgeEngine, NLIEngine
from reward_server.config import RewardServerConfig, load_config
from reward_server.domain import Regime, Verification
from reward_server.eval import progress_bar
from reward_server.eval.classic import ClassicMetrics, add_classic_args, classic_settings
from reward_server.eval.common import Cost, add_config_args, old_outputs, output, overrides, write_json
from reward_server.eval.nli_report import format_all, write_confusion, write_robustness
from reward_server.eval.robustness import DEFAULT_RATES, Pair, describe, perturbed_responses, read_pairs, table
from reward_server.nli.llm_judge import JUDGE_TEMPLATE_VERSION, JudgeVerdict, judge_request, parse_judge_answer
from reward_server.nli.metrics import summarize
from reward_server.nli.settings import NLISettings
from reward_server.nli.verifier import VerifyInput, template_versions, verify_batch
from reward_server.serving.engines import JudgeFactory, NLIFactory

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class EvalItem:
    item_id: str
    inputs: VerifyInput
    gold: Regime | None


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``nli`` command to an argparse subparsers object (the caller sets its ``fn``:
    :func:`run_nli_eval` returns the report to show)."""
    p = subparsers.add_parser("nli", help="NLICV: confusion matrix vs LLM-as-judge, robustness vs classic metrics")
    p.add_argument("--input", type=Path, help="items.jsonl: {response, answer, preference, regime?} per line")
    p.add_argument("--pairs", type=Path, help="pairs.jsonl: {response, reference, label} (robustness)")
    p.add_argument("--out", required=True, type=Path, help="output folder")
    p.add_argument("--evidence", action="store_true", help="also compute ablation evidence")
    p.add_argument("--chunk", type=int, default=64, help="items per batched engine pass")
    p.add_argument("--no-llm-judge", action="store_true", help="skip the LLM-as-judge baseline")
    p.add_argument("--judge-max-new-tokens", type=int, default=48, help="LLM-as-judge answer length")
    p.add_argument("--rates", default=",".join(str(r) for r in DEFAULT_RATES), help="perturbation rates")
    p.add_argument("--seed", type=int, default=0, help="perturbation seed")
    p.add_argument("--classic-threshold", default="fit",
                   help="'fit' (best accuracy on the unperturbed pairs) or a fixed number such as 0.5")  # fmt: skip
    add_classic_args(p)
    add_config_args(p, example="nli")
    return p  # type: ignore[no-any-return]


def read_items(path: Path) -> list[EvalItem]:
    """Parse the JSONL input; ValueError naming the line on any malformed record."""
    from reward_server.eval.common import read_jsonl

    items: list[EvalItem] = []
    for n, rec in read_jsonl(path):
        try:
            fields = [rec.get(k) for k in ("response", "answer", "preference")]
            if not all(isinstance(x, str) for x in fields):
                raise ValueError("response, answer and preference must be strings")
            gold_raw = rec.get("regime")
            gold = Regime(str(gold_raw).strip().lower()) if gold_raw else None
        except ValueError as e:
            raise ValueError(f"{path}:{n}: {e}") from None
        response, answer, preference = (str(x) for x in fields)
        items.append(EvalItem(str(rec.get("id", n)), VerifyInput(response, answer, preference), gold))
    return items


async def _chunked_verify(
    nli: NLIEngine, inputs: Sequence[VerifyInput], settings: NLISettings, *, chunk: int, evidence: bool, bar: Any,
) -> list[Verification]:  # fmt: skip
    out: list[Verification] = []
    for i in range(0, len(inputs), max(1, chunk)):
        part = inputs[i : i + max(1, chunk)]
        out += await verify_batch(nli, part, settings, evidence=evidence)
        if bar is not None:
            bar.update(len(part))
    return out


async def judge_items(
    judge: JudgeEngine, items: Sequence[EvalItem], *, chunk: int, max_new_tokens: int, bar: Any = None
) -> list[JudgeVerdict]:
    """The LLM judge's parsed answer on every item, ``chunk`` requests per generate call."""
    out: list[JudgeVerdict] = []
    for i in range(0, len(items), max(1, chunk)):
        part = items[i : i + max(1, chunk)]
        reqs = [
            judge_request(response=it.inputs.response, answer=it.inputs.answer,
                          preference=it.inputs.preference, max_new_tokens=max_new_tokens)
            for it in part
        ]  # fmt: skip
        answers = await judge.generate(reqs)
        if len(answers) != len(part):
            raise ValueError(f"judge {judge.model_id} returned {len(answers)} answers for {len(part)} requests")
        out += [parse_judge_answer(a) for a in answers]
        if bar is not None:
            bar.update(len(part))
    return out


def _bar(total: int, progress: bool, desc: str) -> Any:
    return progress_bar(total, progress, desc=desc)


async def _regimes(
    doc: dict[str, Any], records: list[dict[str, Any]], items: Sequence[EvalItem], nli: NLIEngine,
    judge: JudgeEngine | None, config: RewardServerConfig, args: argparse.Namespace, costs: list[Cost],
) -> None:  # fmt: skip
    progress = not args.no_progress
    cost = Cost("NLI verifier (regimes)", nli.model_id)
    bar = _bar(len(items), progress, "NLI verifier")
    start = time.perf_counter()
    with cost.timing(len(items)):
        results = await _chunked_verify(nli, [it.inputs for it in items], config.nli, chunk=args.chunk,
                                        evidence=args.evidence, bar=bar)  # fmt: skip
    if bar is not None:
        bar.close()
    costs.append(cost)
    gold = [it.gold for it in items]
    doc.update(summarize(gold, results, seconds=time.perf_counter() - start).to_dict())
    doc |= {"model_id": nli.model_id, "template_versions": template_versions(config.nli),
            "settings": config.nli.model_dump(mode="json")}  # fmt: skip
    for it, v in zip(items, results, strict=True):
        rec: dict[str, Any] = {
            "id": it.item_id, "gold": it.gold.value if it.gold else None, "regime": v.regime.value,
            "s_correct": v.s_correct, "s_aligned": v.s_aligned, "truncated": v.truncated,
        }  # fmt: skip
        if args.evidence:
            rec["evidence"] = [dataclasses.asdict(e) for e in v.evidence]
        records.append(rec)
    if judge is None:
        return
    cost = Cost("LLM-as-judge (JSON)", judge.model_id)
    bar = _bar(len(items), progress, "LLM-as-judge")
    start = time.perf_counter()
    with cost.timing(len(items)):
        verdicts = await judge_items(judge, items, chunk=args.chunk, max_new_tokens=args.judge_max_new_tokens, bar=bar)
    if bar is not None:
        bar.close()
    costs.append(cost)
    tau = config.nli.threshold
    as_v: list[Verification | None] = []
    for d in verdicts:
        regime = d.regime(tau)
        if regime is None or d.s_correct is None or d.s_aligned is None:
            as_v.append(None)
        else:
            as_v.append(Verification(s_correct=d.s_correct, s_aligned=d.s_aligned, regime=regime, truncated=False))
    summary = summarize(gold, as_v, seconds=time.perf_counter() - start).to_dict()
    invalid = {s: sum(1 for d in verdicts if d.status == s) for s in ("unparsable", "out_of_range")}
    summary |= {"model_id": judge.model_id, "template_version": JUDGE_TEMPLATE_VERSION, "invalid": invalid}
    doc["llm_judge"] = summary
    for rec, d in zip(records, verdicts, strict=True):
        r = d.regime(tau)
        rec["judge"] = {"s_correct": d.s_correct, "s_aligned": d.s_aligned, "status": d.status,
                        "regime": r.value if r else None, "answer": d.answer}  # fmt: skip


async def _robustness(
    doc: dict[str, Any], pairs: Sequence[Pair], nli: NLIEngine, config: RewardServerConfig,
    args: argparse.Namespace, costs: list[Cost],
) -> None:  # fmt: skip
    rates = sorted({float(r) for r in args.rates.split(",") if r.strip()})
    if not rates or not all(0.0 <= r <= 1.0 for r in rates):
        raise ValueError(f"--rates must be numbers in [0, 1], got {args.rates!r}")
    perturbed = perturbed_responses(pairs, rates, seed=args.seed)
    refs = [p.reference for p in pairs]
    scores: dict[str, dict[float, list[float]]] = {"nli": {}}
    nli_cost = Cost("NLI verifier (pairs)", nli.model_id)
    bar = _bar(len(pairs) * len(rates), not args.no_progress, "NLI on pairs")
    for r in rates:
        inputs = [VerifyInput(resp, ref, "") for resp, ref in zip(perturbed[r]["responses"], refs, strict=True)]
        with nli_cost.timing(len(inputs)):
            vs = await _chunked_verify(nli, inputs, config.nli, chunk=args.chunk, evidence=False, bar=bar)
        scores["nli"][r] = [v.s_correct for v in vs]
    if bar is not None:
        bar.close()
    costs.append(nli_cost)
    settings = classic_settings(args)
    scorer = ClassicMetrics(settings) if settings is not None else None
    if scorer is not None:
        bar = _bar(len(scorer.names) * len(pairs) * len(rates), not args.no_progress, "classic metrics")
        for m in scorer.names:
            cost = Cost(m, scorer.engine(m))
            scores[m] = {}
            for r in rates:
                with cost.timing(len(pairs)):
                    scores[m][r] = scorer.score(m, perturbed[r]["responses"], refs)
                if bar is not None:
                    bar.update(len(pairs))
            costs.append(cost)
        if bar is not None:
            bar.close()
    rule: float | str = "fit" if args.classic_threshold == "fit" else float(args.classic_threshold)
    t = table(scores, [p.positive for p in pairs], thresholds={m: rule for m in scores}, nli_methods=("nli",),
              nli_tau=config.nli.threshold)  # fmt: skip
    for row in t["rows"]:
        row["replaced_share"] = perturbed[row["rate"]]["replaced_share"]
        row["eligible_share"] = perturbed[row["rate"]]["eligible_share"]
    doc["robustness"] = describe(pairs, seed=args.seed) | t | {
        "nli_model": nli.model_id, "classic": scorer.describe() if scorer else {},
        "missing": scorer.missing if scorer else {}, "examples": {
            str(r): perturbed[r]["responses"][0] for r in rates},
    }  # fmt: skip


def run_nli_eval(
    args: argparse.Namespace, *, judge_factory: JudgeFactory | None = None, nli_factory: NLIFactory | None = None
) -> str:
    """Entry point of ``eval nli``: writes the outputs under ``--out`` and returns the report.
    Bad input raises ValueError (or OSError for a file that cannot be read)."""
    from reward_server.serving import start_engines

    config = load_config(args.config, overrides=overrides(args))
    items = read_items(args.input) if args.input else []
    pairs = read_pairs(args.pairs) if args.pairs else []
    if args.classic_threshold != "fit":
        try:
            float(args.classic_threshold)
        except ValueError:
            raise ValueError(f"--classic-threshold {args.classic_threshold!r}: give 'fit' or a "
                             "number such as 0.5") from None
    if not items and not pairs:
        raise ValueError("nothing to evaluate: give --input items.jsonl and/or --pairs pairs.jsonl")
    use_judge = bool(items) and not args.no_llm_judge and config.engines.judge is not None
    engines = start_engines(config.engines, config.serving, require=("nli", "judge") if use_judge else ("nli",),
                            judge_factory=judge_factory, nli_factory=nli_factory)  # fmt: skip
    doc: dict[str, Any] = {}
    records: list[dict[str, Any]] = []
    costs: list[Cost] = []

    async def go() -> None:
        try:
            if items:
                await _regimes(doc, records, items, engines.nli, engines.judge if use_judge else None,
                               config, args, costs)  # fmt: skip
            if pairs:
                await _robustness(doc, pairs, engines.nli, config, args, costs)
        finally:
            await engines.close()

    asyncio.run(go())
    if items and not use_judge:
        why = "--no-llm-judge" if args.no_llm_judge else "engines.judge is not set (set it, or use --fake)"
        doc["llm_judge"] = {"missing": why}
    doc["cost"] = [c.to_dict() for c in costs]
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    summary = output(out, "nli", "eval.json")
    written = [summary]
    doc = write_json(summary, doc)
    if records:
        samples = output(out, "nli", "samples.jsonl")
        with samples.open("w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        written.append(samples)
    if not args.no_plot:
        for name, writer in (("confusion.png", write_confusion), ("robustness.png", write_robustness)):
            if writer(doc, output(out, "nli", name)):
                written.append(output(out, "nli", name))
    if old := old_outputs(out, "nli"):
        logger.warning("%s in %s are from an earlier run (names before nli_eval.json, "
                       "nli_samples.jsonl, nli_*.png); not updated", ", ".join(map(str, old)), out)
    return format_all(doc) + "\nwrote " + ", ".join(str(p) for p in written)
