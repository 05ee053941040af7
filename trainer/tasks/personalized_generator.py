"""Personalized generator task: the policy writes the user's text for a new context.

Prompt = the user's history (context -> their text) + the target's context. Reward, chosen per
data set (``reward_kind``):

rubric_score      the text scored under the user's induced rules (``rules`` in extra_info)
nli_constraints   NLICV: Correct(response, answer) and Aligned(response, preference)
weighted          sum(w_i * r_i) / sum(w_i) over the two above (``weights``)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reward_server.domain import RubricAggregate
from reward_server.rubric.templates import TASK_LABELS
from trainer.data.records import DataFormatError, UserRecord
from trainer.tasks.common import PERSONALIZED_KINDS, base_extra_info

SYSTEM = (
    "You write on behalf of one specific user. Study how this user writes in the examples and "
    "write the new text exactly as they would: same length, structure, tone and habits."
)
USER = """Here are {n} examples of {writing} written by this user, each with its {context_lower}.

{history}

Now write this user's {text_lower} for the following {context_lower}.
{context_label}: {query}

Answer with the {text_lower} only."""
ITEM = "### Example {i}\n{context_label}: {context}\n{text_label}: {text}"


def build_prompt(record: UserRecord, *, history_limit: int = 10) -> list[dict[str, str]]:
    labels = TASK_LABELS[record.task]
    context_lower = labels.context.split(" (")[0].lower()
    history = "\n\n".join(
        ITEM.format(i=i + 1, context_label=labels.context, context=h.context.strip() or "(none)",
                    text_label=labels.text, text=h.text.strip())
        for i, h in enumerate(record.history[-history_limit:])
    )
    user = USER.format(
        n=len(record.history[-history_limit:]), writing=labels.writing, history=history,
        context_lower=context_lower, text_lower=labels.text.lower(),
        context_label=labels.context, query=record.target.context.strip() or "(none)",
    )
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def build_extra_info(
    record: UserRecord,
    index: int,
    *,
    reward_kind: str = "rubric_score",
    weights: Mapping[str, float] | None = None,
    aggregate: RubricAggregate | None = None,
) -> dict[str, Any]:
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
    extra = base_extra_info(record, index)
    extra["kind"] = reward_kind
    if reward_kind == "weighted":
        w = dict(weights or {"rubric_score": 0.5, "nli_constraints": 0.5})
        unknown = set(w) - {"rubric_score", "nli_constraints"}
        if unknown or not sum(w.values()) > 0 or any(v < 0 for v in w.values()):
            raise ValueError(f"weights {w}: keys rubric_score/nli_constraints, non-negative, "
                             "positive sum")
        extra["weights"] = {"rubric_score": float(w.get("rubric_score", 0.0)),
                            "nli_constraints": float(w.get("nli_constraints", 0.0))}
    if aggregate is not None:
        extra["aggregate"] = aggregate.value
    return extra
