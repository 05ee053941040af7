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
    NliConstraintsSpec,
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
DEFAULT_WEIGHTS = {"rubric_score": 0.5, "nli_constraints": 0.5}


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


def _weights(weights: Mapping[str, float] | None) -> tuple[float, float]:
    w = dict(weights or DEFAULT_WEIGHTS)
    unknown = set(w) - set(DEFAULT_WEIGHTS)
    if unknown or not sum(w.values()) > 0 or any(v < 0 for v in w.values()):
        raise ValueError(f"weights {w}: keys rubric_score/nli_constraints, non-negative, "
                         "positive sum")
    return float(w.get("rubric_score", 0.0)), float(w.get("nli_constraints", 0.0))


def build_spec(
    record: UserRecord,
    *,
    reward_kind: str = "rubric_score",
    weights: Mapping[str, float] | None = None,
    aggregate: RubricAggregate | None = None,
) -> ItemSpec:
    """The row's reward item, its response left empty (the rollout fills it in)."""
    if reward_kind not in PERSONALIZED_KINDS:
        raise ValueError(f"reward kind {reward_kind!r}: choose one of {PERSONALIZED_KINDS}")
    where = record.source or "<records>"
    needs_rules = reward_kind in ("rubric_score", "weighted")
    needs_nli = reward_kind in ("nli_constraints", "weighted")
    if needs_rules and not record.rules:
        raise DataFormatError(where, None, "rules", f"user {record.user_id!r} has no induced "
                              f"rules; {reward_kind} needs them (pass --rules FILE)")
    if needs_nli and not (record.answer and record.preference):
        raise DataFormatError(where, None, "answer/preference", f"user {record.user_id!r} has "
                              f"no NLI constraints; {reward_kind} needs them (pass --constraints)")
    rubric = RubricScoreSpec(context=record.target.context, text="", rules=record.rules,
                             task=record.task, aggregate=aggregate)
    nli = NliConstraintsSpec(response="", answer=record.answer, preference=record.preference)
    if reward_kind == "rubric_score":
        return rubric
    if reward_kind == "nli_constraints":
        return nli
    w_rubric, w_nli = _weights(weights)
    return WeightedSpec(parts=(WeightedPart(w_rubric, rubric), WeightedPart(w_nli, nli)))
