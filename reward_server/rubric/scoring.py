"""Judge-backed science: rubric scores, validation and PARL rewards (docs/parl.md §2-§4)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from reward_server.backends.base import JudgeEngine, JudgePrompt
from reward_server.components import ParlReward, RubricScore
from reward_server.domain import (
    HistoryItem,
    ParlRewardSpec,
    RewardOutcome,
    RubricAggregate,
    RubricScoreSpec,
    Task,
)
from reward_server.errors import EngineError
from reward_server.rubric import formulas
from reward_server.rubric.parsing import parse_rubric_output
from reward_server.rubric.settings import RubricSettings
from reward_server.rubric.templates import judge_prompts

logger = logging.getLogger(__name__)


async def judge_batch(judge: JudgeEngine, prompts: Sequence[JudgePrompt]) -> list[float]:
    """One batched judge call, checked: one probability in [0, 1] per prompt."""
    if not prompts:
        return []
    out = await judge.p_yes(prompts)
    if len(out) != len(prompts):
        raise EngineError(
            f"judge {judge.model_id} returned {len(out)} scores for {len(prompts)} prompts"
        )
    for p in out:
        if not 0.0 <= p <= 1.0:  # also rejects NaN
            raise EngineError(f"judge {judge.model_id} returned p_yes={p!r} outside [0, 1]")
    return [float(p) for p in out]


async def score_rubric(
    judge: JudgeEngine, spec: RubricScoreSpec, settings: RubricSettings
) -> RewardOutcome:
    """Score a personalized generator's text under its user's rules (one judge call).

    ``spec`` is a validated request (at least one rule)."""
    prompts = judge_prompts(spec.context, spec.text, spec.rules, spec.task, template=settings.template_version)
    p = await judge_batch(judge, prompts)
    mean_p = formulas.rubric_score(p)
    frac = sum(1 for x in p if settings.satisfied(x)) / len(p)
    all_ok = 1.0 if frac == 1.0 else 0.0
    aggregate = spec.aggregate or settings.default_aggregate
    reward = {
        RubricAggregate.MEAN_P_YES: mean_p,
        RubricAggregate.FRACTION_SATISFIED: frac,
        RubricAggregate.ALL_SATISFIED: all_ok,
    }[aggregate]
    c = RubricScore
    components: dict[str, float] = {
        c.MEAN_P_YES.name: mean_p,
        c.FRACTION_SATISFIED.name: frac,
        c.ALL_SATISFIED.name: all_ok,
        c.N_RULES.name: float(len(p)),
    }
    components.update({c.P_YES.at(i): x for i, x in enumerate(p)})
    return RewardOutcome(reward=reward, components=components)


async def first_failures(
    judge: JudgeEngine,
    rule_sets: Sequence[Sequence[str]],
    history: Sequence[HistoryItem],
    task: Task,
    settings: RubricSettings,
) -> list[list[int | None]]:
    """Per rule set and rule, the index of the first history item the rule is not satisfied
    (``settings.satisfied``) on; None when it holds on every item.

    All judgments of all sets go to the judge in one batched call; with
    ``validation_early_exit`` the history is judged one item per round and a rule stops being
    judged once it fails.
    """
    if not history:
        raise ValueError("validating rules needs at least one history item")
    failed: list[list[int | None]] = [[None] * len(rules) for rules in rule_sets]
    rounds = [[k] for k in range(len(history))] if settings.validation_early_exit else [list(range(len(history)))]
    for items in rounds:
        index: list[tuple[int, int, int]] = []
        prompts: list[JudgePrompt] = []
        for k in items:
            h = history[k]
            for s, rules in enumerate(rule_sets):
                todo = [j for j, f in enumerate(failed[s]) if f is None]
                index.extend((s, j, k) for j in todo)
                todo_rules = [rules[j] for j in todo]
                prompts.extend(judge_prompts(h.context, h.text, todo_rules, task, template=settings.template_version))
        if not prompts:
            break
        for (s, j, k), p in zip(index, await judge_batch(judge, prompts), strict=True):
            if failed[s][j] is None and not settings.satisfied(p):  # index runs in item order
                failed[s][j] = k
    return failed


async def validate_rule_sets(
    judge: JudgeEngine,
    rule_sets: Sequence[Sequence[str]],
    history: Sequence[HistoryItem],
    task: Task,
    settings: RubricSettings,
) -> list[tuple[str, ...]]:
    """Keep, per rule set, the rules satisfied (``settings.satisfied``) on EVERY history item
    (one batched judge call; see :func:`first_failures`)."""
    failed = await first_failures(judge, rule_sets, history, task, settings)
    return [
        tuple(r for r, f in zip(rules, failed[s], strict=True) if f is None)
        for s, rules in enumerate(rule_sets)
    ]


async def parl_reward(
    judge: JudgeEngine, spec: ParlRewardSpec, settings: RubricSettings
) -> RewardOutcome:
    """PARL-0/A/B reward of one rubric-generator rollout (PARL §3: parse, validate on the
    history, score target and baselines). An unparsable output is policy-invalid (the service
    applies the configured penalty)."""
    c = ParlReward
    parsed = parse_rubric_output(spec.policy_output, settings, mode="training")
    counts = {c.N_PARSED.name: float(parsed.n_parsed), c.N_LENGTH_OK.name: float(parsed.n_length_ok)}
    if parsed.invalid_reason is not None:
        return RewardOutcome(
            reward=None,
            components={**counts, c.N_VALID.name: 0.0, c.FLOOR_APPLIED.name: 1.0},
            policy_invalid=parsed.invalid_reason,
        )
    history = spec.history[-settings.history_limit :]
    (failed,) = await first_failures(judge, [parsed.rules], history, spec.task, settings)
    valid = tuple(r for r, f in zip(parsed.rules, failed, strict=True) if f is None)
    counts[c.N_VALID.name] = float(len(valid))
    if not settings.min_rules <= len(valid) <= settings.max_rules:
        return RewardOutcome(
            reward=settings.format_floor, components={**counts, c.FLOOR_APPLIED.name: 1.0}
        )
    target_text = spec.target.text
    if settings.released_target_overwrite:  # parl_rm_a.py's loop variable gt replaces the target
        last = failed[-1]
        target_text = history[len(history) - 1 if last is None else last].text
    texts = [target_text, *spec.baselines]
    prompts = [
        p
        for t in texts
        for p in judge_prompts(spec.target.context, t, valid, spec.task, template=settings.template_version)
    ]
    p = await judge_batch(judge, prompts)
    n = len(valid)
    scores = [formulas.rubric_score(p[i * n : (i + 1) * n]) for i in range(len(texts))]
    s_target, s_base = scores[0], scores[1:]
    deltas = [s_target - b for b in s_base]
    gamma = formulas.margin_product(deltas, settings.margin_k)
    card = formulas.cardinality(n, settings.cardinality)
    reward = formulas.parl_value(
        spec.variant,
        base=settings.format_floor,
        lam=settings.reward_lambda,
        card=card,
        s_target=s_target,
        gamma=gamma,
    )
    components: dict[str, float] = {
        c.S_TARGET.name: s_target,
        **{c.S_BASELINE.at(i): b for i, b in enumerate(s_base)},
        **{c.DELTA.at(i): d for i, d in enumerate(deltas)},
        c.GAMMA.name: gamma,
        c.CARDINALITY.name: card,
        **counts,
        c.FLOOR_APPLIED.name: 0.0,
    }
    return RewardOutcome(reward=reward, components=components)
