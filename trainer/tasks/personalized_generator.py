"""Personalized generator task: the policy writes the user's text for a new context.

Prompt = the user's history (context -> their text, rendered by the server's own
:func:`~reward_server.rubric.templates.render_history`) + the target's context. Reward, chosen
per data set (``reward_kind``):

rubric_score      the text scored under the user's induced rules
nli_constraints   NLICV: Correct(response, answer) and Aligned(response, preference)
weighted          sum(w_i * r_i) / sum(w_i) over the two above (``weights``)
"""

from __future__ import annotations

from collections.abc import Mapping

from reward_server.domain import (
    ItemSpec,
    LeafSpec,
    NliConstraintsSpec,
    RewardKind,
    RubricAggregate,
    RubricScoreSpec,
    WeightedPart,
    WeightedSpec,
)
from reward_server.prompts import TASK_LABELS, render_history
from trainer.data.records import DataFormatError, UserRecord
from trainer.tasks.common import PERSONALIZED_KINDS

SYSTEM = (
    "You write on behalf of one specific user. Study how this user writes in the examples and "
    "write the new text exactly as they would: same length, structure, tone and habits."
)
USER = """Here are {n} examples of {writing} written by this user, each with its {context_lower}.

{history}

Now write this user's {text_lower} for the following {context_lower}.
{context_label}: {query}

Answer with the {text_lower} only."""
# the weighted kind's parts, in order, with their default weights
DEFAULT_WEIGHTS = {RewardKind.RUBRIC_SCORE: 0.5, RewardKind.NLI_CONSTRAINTS: 0.5}


def build_prompt(record: UserRecord, *, history_limit: int = 10) -> list[dict[str, str]]:
    labels = TASK_LABELS[record.task]
    history = record.history[-history_limit:]
    user = USER.format(
        n=len(history), writing=labels.writing,
        history=render_history(history, record.task, heading="Example"),
        context_lower=labels.context.split(" (")[0].lower(), text_lower=labels.text.lower(),
        context_label=labels.context, query=record.target.context.strip() or "(none)",
    )
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def _weights(weights: Mapping[str, float] | None) -> dict[RewardKind, float]:
    """Each part's weight (keys: the parts' kinds, as ``--weights`` names them)."""
    names = [k.value for k in DEFAULT_WEIGHTS]
    given = {str(k): float(v) for k, v in (weights or DEFAULT_WEIGHTS).items()}
    if (set(given) - set(names) or not sum(given.values()) > 0
            or any(v < 0 for v in given.values())):
        raise ValueError(f"weights {given}: keys {'/'.join(names)}, non-negative, positive sum")
    return {k: given.get(k.value, 0.0) for k in DEFAULT_WEIGHTS}


def build_spec(
    record: UserRecord,
    *,
    reward_kind: RewardKind = RewardKind.RUBRIC_SCORE,
    weights: Mapping[str, float] | None = None,
    aggregate: RubricAggregate | None = None,
) -> ItemSpec:
    """The row's reward item, its response left empty (the rollout fills it in): the rubric
    score, the NLI constraints, or both as the weighted kind's parts (``weights``)."""
    if reward_kind not in PERSONALIZED_KINDS:
        raise ValueError(f"reward kind {reward_kind!r}: choose one of "
                         f"{[k.value for k in PERSONALIZED_KINDS]}")
    where = record.source or "<records>"
    leaves: dict[RewardKind, LeafSpec] = {}
    if reward_kind in (RewardKind.RUBRIC_SCORE, RewardKind.WEIGHTED):
        if not record.rules:
            raise DataFormatError(where, None, "rules", f"user {record.user_id!r} has no induced "
                                  f"rules; {reward_kind.value} needs them (pass --rules FILE)")
        leaves[RewardKind.RUBRIC_SCORE] = RubricScoreSpec(
            context=record.target.context, text="", rules=record.rules, task=record.task,
            aggregate=aggregate)
    if reward_kind in (RewardKind.NLI_CONSTRAINTS, RewardKind.WEIGHTED):
        if not (record.answer and record.preference):
            raise DataFormatError(where, None, "answer/preference", f"user {record.user_id!r} "
                                  f"has no NLI constraints; {reward_kind.value} needs them (pass "
                                  "--constraints)")
        leaves[RewardKind.NLI_CONSTRAINTS] = NliConstraintsSpec(
            response="", answer=record.answer, preference=record.preference)
    if reward_kind is not RewardKind.WEIGHTED:
        return leaves[reward_kind]
    return WeightedSpec(parts=tuple(WeightedPart(weight, leaves[kind])
                                    for kind, weight in _weights(weights).items()))
