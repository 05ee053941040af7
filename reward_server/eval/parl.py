"""``reward-server eval parl``: PARL's comparison table from files (formats: docs/evaluation.md).

Inputs: ``--rubrics R.jsonl`` (each user's rules and task), ``--predictions DIR`` (one
``<method>.jsonl`` per method, the ground truth in ``gt.jsonl``), ``--history H.jsonl`` (each
user's raw history, for the LLM-as-judge baseline; without it that column is not run).

Per method: user-level and rubric-level accuracy of the rubrics (ours, judged by
``engines.judge`` p_yes), the holistic LLM-as-judge 1-5 score normalised by (s-1)/4 (the same
judge, sampled answers, :mod:`reward_server.rubric.holistic`), the classic metrics against the
ground truth (:mod:`reward_server.eval.classic`), Max-Diff with its paired t-test for both
judges, coverage, and the cost per item of every evaluator. Outputs in ``--out`` (named as every
eval command's, :func:`reward_server.eval.common.output`): ``parl_eval.json`` (the source of
truth), ``parl_eval.png`` (rendered from it), ``parl_samples.jsonl`` (per method and sample:
rule p_yes, the judge's answer, classic scores); the table is printed on stdout, progress bars
run on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reward_server.backends.base import JudgeEngine, JudgePrompt
from reward_server.domain import HistoryItem, Task
from reward_server.eval import progress_bar
from reward_server.eval.classic import ClassicMetrics, ClassicSettings, add_classic_args, classic_settings
from reward_server.eval.common import Cost, add_config_args, output, overrides, write_json
from reward_server.eval.parl_io import Sample, UserRubric, read_history, read_methods, read_rubrics
from reward_server.eval.parl_report import format_table, plot, summarize
from reward_server.rubric.holistic import (
    HOLISTIC_TEMPLATE_VERSION,
    HolisticScore,
    holistic_request,
    parse_holistic_score,
)
from reward_server.rubric.parsing import released_postprocess
from reward_server.rubric.scoring import judge_batch
from reward_server.rubric.settings import RubricSettings, TemplateVersion
from reward_server.rubric.templates import DEFAULT_TEMPLATE, judge_prompts, template_versions
from reward_server.serving.engines import JudgeFactory

Key = tuple[str, str]
NO_RUBRIC = UserRubric((), Task.GENERIC)


@dataclass(frozen=True)
class ParlOptions:
    gt: str = "gt"
    chunk: int = 16
    progress: bool = True
    history: Mapping[str, Sequence[HistoryItem]] | None = None  # None: no LLM-as-judge
    judge_max_new_tokens: int = 8
    classic: ClassicSettings | None = dataclasses.field(default_factory=ClassicSettings)  # None: none


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``parl`` command to an argparse subparsers object (the caller sets its ``fn``:
    :func:`run_parl_eval` returns the report to show)."""
    p = subparsers.add_parser("parl", help="PARL comparison table: rubrics, LLM-as-judge, classic metrics")
    p.add_argument("--rubrics", required=True, type=Path, help="R.jsonl: {user_id, rules, task?} per line")
    p.add_argument("--predictions", required=True, type=Path, help="folder of <method>.jsonl (and gt.jsonl)")
    p.add_argument("--history", type=Path, help="H.jsonl: {user_id, history: [{context, text}]} (LLM-as-judge)")
    p.add_argument("--out", required=True, type=Path, help="output folder")
    p.add_argument("--gt", default="gt", help="method name of the ground truth (file <gt>.jsonl)")
    p.add_argument("--chunk", type=int, default=16, help="samples per batched judge call")
    p.add_argument("--no-llm-judge", action="store_true", help="skip the LLM-as-judge baseline")
    p.add_argument("--judge-max-new-tokens", type=int, default=8, help="LLM-as-judge answer length")
    add_classic_args(p)
    add_config_args(p, example="parl")
    return p  # type: ignore[no-any-return]


async def judge_samples(
    judge: JudgeEngine, rubrics: Mapping[str, UserRubric], samples: Sequence[Sample], *,
    chunk: int, template: TemplateVersion = DEFAULT_TEMPLATE, on_progress: Callable[[int], None] | None = None,
) -> dict[Key, list[float]]:  # fmt: skip
    """p_yes of every rule of the sample's user on the sample's text (empty: no rule), judged
    with prompt template ``template``."""
    out: dict[Key, list[float]] = {}
    for start in range(0, len(samples), chunk):
        part = samples[start : start + chunk]
        prompts: list[JudgePrompt] = []
        spans: list[tuple[Key, int, int]] = []
        for s in part:
            ur = rubrics.get(s.key[0], NO_RUBRIC)
            spans.append((s.key, len(prompts), len(ur.rules)))
            prompts.extend(judge_prompts(s.context, s.text, ur.rules, ur.task, template=template))
        p = await judge_batch(judge, prompts)
        for key, at, n in spans:
            out[key] = p[at : at + n]
        if on_progress:
            on_progress(len(part))
    return out


async def judge_holistic(
    judge: JudgeEngine, rubrics: Mapping[str, UserRubric], history: Mapping[str, Sequence[HistoryItem]],
    samples: Sequence[Sample], *, chunk: int, history_limit: int, max_new_tokens: int,
    on_progress: Callable[[int], None] | None = None,
) -> dict[Key, HolisticScore]:  # fmt: skip
    """The holistic 1-5 answer on every sample whose user has a history (others are skipped)."""
    todo = [s for s in samples if history.get(s.key[0])]
    out: dict[Key, HolisticScore] = {}
    for start in range(0, len(todo), chunk):
        part = todo[start : start + chunk]
        requests = [
            holistic_request(
                tuple(history[s.key[0]])[-history_limit:], context=s.context, text=s.text,
                task=rubrics.get(s.key[0], NO_RUBRIC).task, max_new_tokens=max_new_tokens,
            )
            for s in part
        ]
        answers = await judge.generate(requests)
        if len(answers) != len(part):
            raise ValueError(f"judge {judge.model_id} returned {len(answers)} answers for {len(part)} requests")
        for s, a in zip(part, answers, strict=True):
            out[s.key] = parse_holistic_score(a)
        if on_progress:
            on_progress(len(part))
    return out


def score_classic(
    scorer: ClassicMetrics, methods: Mapping[str, Sequence[Sample]], *, gt: str, costs: dict[str, Cost],
    progress: bool,
) -> dict[str, dict[str, dict[Key, float]]]:  # fmt: skip
    """method -> metric -> sample -> score of the method's text against the GT text."""
    ref = {s.key: s.text for s in methods[gt]}
    out: dict[str, dict[str, dict[Key, float]]] = {}
    pairs = {m: [s for s in ss if s.key in ref] for m, ss in methods.items() if m != gt}
    total = len(scorer.names) * sum(len(p) for p in pairs.values())
    bar = progress_bar(total, progress, unit="pair", desc="classic metrics")
    try:
        for name, ps in pairs.items():
            out[name] = {}
            for metric in scorer.names:
                with costs[metric].timing(len(ps)):
                    values = scorer.score(metric, [s.text for s in ps], [ref[s.key] for s in ps])
                out[name][metric] = {s.key: v for s, v in zip(ps, values, strict=True)}
                if bar is not None:
                    bar.update(len(ps))
    finally:
        if bar is not None:
            bar.close()
    return out


def clean_predictions(methods: Mapping[str, Sequence[Sample]], settings: RubricSettings) -> dict[str, list[Sample]]:
    """Every method's texts (the ground truth's too) as PARL's eval-test.py reads them: with
    ``text_cleaning=released``, cut after the first ``</think>`` and the ``[Review]:``-style
    markers (its ``postprocess_output``); ``none``: as written."""
    if settings.text_cleaning == "none":
        return {name: list(samples) for name, samples in methods.items()}
    return {
        name: [dataclasses.replace(s, text=released_postprocess(s.text)) for s in samples]
        for name, samples in methods.items()
    }


async def evaluate(
    judge: JudgeEngine, rubrics: Mapping[str, UserRubric], methods: Mapping[str, Sequence[Sample]], *,
    settings: RubricSettings, options: ParlOptions,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:  # fmt: skip
    """Every column of the table as the JSON document (before it is written), and per-sample
    records. The texts are cleaned first (:func:`clean_predictions`) for every column."""
    methods = clean_predictions(methods, settings)
    total = sum(len(s) for s in methods.values())
    costs: dict[str, Cost] = {"rubric judge (p_yes)": Cost("rubric judge (p_yes)", judge.model_id)}
    bar = progress_bar(total, options.progress, unit="sample", desc="rubric judge")
    try:
        judged = {}
        for name, s in methods.items():
            with costs["rubric judge (p_yes)"].timing(len(s)):
                judged[name] = await judge_samples(judge, rubrics, s, chunk=options.chunk,
                                                   template=settings.template_version,
                                                   on_progress=bar.update if bar else None)  # fmt: skip
    finally:
        if bar is not None:
            bar.close()
    holistic: dict[str, dict[Key, HolisticScore]] | None = None
    judge_doc: dict[str, Any] = {"missing": "no --history given"}
    if options.history is not None:
        cost = costs["LLM-as-judge (1-5)"] = Cost("LLM-as-judge (1-5)", judge.model_id)
        n = sum(1 for ss in methods.values() for s in ss if options.history.get(s.key[0]))
        bar = progress_bar(n, options.progress, unit="sample", desc="LLM-as-judge")
        holistic = {}
        try:
            for name, s in methods.items():
                with cost.timing(0):
                    holistic[name] = await judge_holistic(
                        judge, rubrics, options.history, s, chunk=options.chunk,
                        history_limit=settings.history_limit, max_new_tokens=options.judge_max_new_tokens,
                        on_progress=bar.update if bar else None,
                    )  # fmt: skip
                cost.items += len(holistic[name])
        finally:
            if bar is not None:
                bar.close()
        judge_doc = {"model": judge.model_id, "template_version": HOLISTIC_TEMPLATE_VERSION}
    classic = None
    classic_doc: dict[str, Any] = {}
    if options.classic is not None:
        scorer = ClassicMetrics(options.classic)
        for m in scorer.names:
            costs[m] = Cost(m, scorer.engine(m))
        classic = score_classic(scorer, methods, gt=options.gt, costs=costs, progress=options.progress)
        classic_doc = scorer.describe()
    result = summarize(judged, rubrics, gt=options.gt, threshold=settings.threshold,
                       inclusive=settings.threshold_rule == "ge", holistic=holistic, classic=classic)  # fmt: skip
    result["llm_judge"] = judge_doc
    result["classic"] = classic_doc
    result["judge_model"] = judge.model_id
    result["template_versions"] = template_versions(settings) | {"rubric.holistic": HOLISTIC_TEMPLATE_VERSION}
    result["cost"] = [c.to_dict() for c in costs.values()]
    return result, sample_records(judged, holistic, classic)


def sample_records(
    judged: Mapping[str, Mapping[Key, Sequence[float]]],
    holistic: Mapping[str, Mapping[Key, HolisticScore]] | None,
    classic: Mapping[str, Mapping[str, Mapping[Key, float]]] | None,
) -> list[dict[str, Any]]:
    """One record per (method, sample): rule p_yes, the LLM judge's answer, classic scores."""
    out: list[dict[str, Any]] = []
    for name, table in judged.items():
        for key, p in table.items():
            rec: dict[str, Any] = {"method": name, "user_id": key[0], "sample_id": key[1], "p_yes": list(p)}
            h = (holistic or {}).get(name, {}).get(key)
            if h is not None:
                rec["llm_judge"] = {"score": h.score, "status": h.status, "answer": h.answer}
            scores = {m: v[key] for m, v in (classic or {}).get(name, {}).items() if key in v}
            if scores:
                rec["classic"] = scores
            out.append(rec)
    return out


def run_parl_eval(args: argparse.Namespace, *, judge_factory: JudgeFactory | None = None) -> str:
    """Entry point of ``reward-server eval parl``: writes the outputs under ``--out`` and
    returns the report (the table and the files written). Bad input raises ValueError (or
    OSError for a file that cannot be read), naming the file, the line and the fix."""
    from reward_server.config import load_config
    from reward_server.serving import start_engines

    cfg = load_config(args.config, overrides=overrides(args))
    rubrics = read_rubrics(args.rubrics)
    methods = read_methods(args.predictions, args.gt)
    history = read_history(args.history) if args.history and not args.no_llm_judge else None
    options = ParlOptions(
        gt=args.gt, chunk=args.chunk, progress=not args.no_progress, history=history,
        judge_max_new_tokens=args.judge_max_new_tokens, classic=classic_settings(args),
    )  # fmt: skip
    engines = start_engines(cfg.engines, cfg.serving, require=("judge",), judge_factory=judge_factory)

    async def go() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        try:
            return await evaluate(engines.judge, rubrics, methods, settings=cfg.rubric, options=options)
        finally:
            await engines.close()

    result, records = asyncio.run(go())
    if args.no_llm_judge:
        result["llm_judge"] = {"missing": "--no-llm-judge"}
    args.out.mkdir(parents=True, exist_ok=True)
    doc = write_json(output(args.out, "parl", "eval.json"), result)
    samples = output(args.out, "parl", "samples.jsonl")
    with samples.open("w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    written = [output(args.out, "parl", "eval.json"), samples]
    if not args.no_plot and plot(doc, output(args.out, "parl", "eval.png")):
        written.append(output(args.out, "parl", "eval.png"))
    return format_table(doc) + "\nwrote " + ", ".join(str(p) for p in written)
