"""Rubric induction at inference time (docs/parl.md §3): sample k times, validate, keep the best."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from reward_server.backends.base import JudgeEngine
from reward_server.domain import HistoryItem, InductionAttempt, InductionResult, Task
from reward_server.errors import EngineError
from reward_server.rubric.parsing import parse_rubric_output, released_postprocess
from reward_server.rubric.scoring import validate_rule_sets
from reward_server.rubric.settings import RubricSettings
from reward_server.rubric.templates import generator_request

logger = logging.getLogger(__name__)


async def induce_rubrics(
    judge: JudgeEngine,
    *,
    history: Sequence[HistoryItem],
    task: Task,
    settings: RubricSettings,
    num_samples: int | None = None,
    seed: int = 0,
) -> InductionResult:
    """Sample the generator ``num_samples`` times (seeds ``seed + i``) on the last
    ``history_limit`` items, validate every attempt in one judge call (on the items
    ``settings.induction_validation_in_use`` names: released = Amazon every item, other tasks
    the last ``history_limit``, as PARL's generate-rubrics scripts), keep the attempt with the
    most surviving rules (the earliest on ties). ``covered`` iff that attempt kept a rule. With
    ``text_cleaning=released`` the validated history texts are cleaned first by PARL's
    postprocess, as generate-rubrics does (the generator's prompt shows them as written).
    Arguments are a validated request (history non-empty, ``num_samples`` >= 1 or None)."""
    k = settings.induction_samples if num_samples is None else num_samples
    if k < 1:
        raise ValueError(f"num_samples must be at least 1, got {k}")
    hist = tuple(history)[-settings.history_limit :]
    if not hist:
        raise ValueError("rubric induction needs at least one history item")
    requests = [generator_request(hist, task, settings, seed=seed + i) for i in range(k)]
    outputs = await judge.generate(requests)
    if len(outputs) != k:
        raise EngineError(f"generator returned {len(outputs)} outputs for {k} requests")
    parsed = [parse_rubric_output(o, settings, mode="inference") for o in outputs]
    whole = settings.induction_validation_in_use == "released" and task == Task.AMAZON
    checked = tuple(history) if whole else hist
    if settings.text_cleaning == "released":
        checked = tuple(HistoryItem(h.context, released_postprocess(h.text)) for h in checked)
    valid = await validate_rule_sets(judge, [p.rules for p in parsed], checked, task, settings)
    attempts = tuple(
        InductionAttempt(
            raw_output=o, parsed_rules=p.rules, valid_rules=v, invalid_reason=p.invalid_reason
        )
        for o, p, v in zip(outputs, parsed, valid, strict=True)
    )
    best = -1
    for i, a in enumerate(attempts):
        if a.valid_rules and (best < 0 or len(a.valid_rules) > len(attempts[best].valid_rules)):
            best = i
    rules = attempts[best].valid_rules if best >= 0 else ()
    logger.debug("induction: %d attempts, best=%d with %d rules", k, best, len(rules))
    return InductionResult(rules=rules, covered=bool(rules), attempts=attempts, best_attempt=best)
