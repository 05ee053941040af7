"""The ``extra_info`` contract: one training row's reward inputs -> a reward-server item.

``python -m trainer.data.prepare`` writes, per prompt, an ``extra_info`` dict (verl parquet
column ``extra_info``; TRL parquet column ``extra_info_json``, the same dict as JSON) holding
everything its reward needs; the TRL and verl reward functions of this package turn it plus one
rollout into a :class:`~reward_server.domain.ScoreItem`. Keys (unused ones empty)::

    kind          "parl_reward" | "rubric_score" | "nli_constraints" | "weighted"
    task          "amazon" | "news" | "reddit" | "generic"
    user_id, index
    history       [{"context", "text"}, ...]   (oldest first; PARL validation needs it)
    target        {"context", "text"}          (the user's held-out item)
    baselines     [str]                        (PARL negatives)
    variant       "0" | "A" | "B"              (PARL)
    rules         [str]                        (the user's rubric: rubric_score)
    answer, preference                         (NLICV constraints)
    weights       {"rubric_score": w, "nli_constraints": w}   (weighted)
    aggregate, nli_reward_function             ("" = server default)

Also the fixed component keys each kind reports to a trainer, read from the server's one
declaration (:mod:`reward_server.components`): verl builds its per-sample metric arrays from the
FIRST result's keys, so every result of a run must carry the same keys. A component the server
did not compute (e.g. after a policy-invalid output) is 0.0 with its ``<name>_mask`` 0.0
(:func:`reward_server.components.with_masks`), never NaN.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reward_server import components
from reward_server.domain import (
    HistoryItem,
    ItemSpec,
    NliConstraintsSpec,
    NliRewardFunction,
    ParlRewardSpec,
    ParlVariant,
    RewardKind,
    RubricAggregate,
    RubricScoreSpec,
    Task,
    WeightedPart,
    WeightedSpec,
)

# The weighted kind the trainer builds: part 0 the rubric score, part 1 the NLI constraints.
WEIGHTED_PARTS = (RewardKind.RUBRIC_SCORE, RewardKind.NLI_CONSTRAINTS)
COMPONENT_KEYS: dict[str, tuple[str, ...]] = {
    **{k.value: components.fixed_names(k) for k in components.LEAF_KINDS},
    RewardKind.WEIGHTED.value: components.weighted_names(WEIGHTED_PARTS),
}
STATUS_KEYS = ("policy_invalid", "reward_masked")


class ExtraInfoError(ValueError):
    """extra_info lacks what its kind needs: the data was not prepared by trainer.data.prepare."""


def _get(extra: Mapping[str, Any], key: str) -> Any:
    if key not in extra or extra[key] is None:
        raise ExtraInfoError(
            f"extra_info has no {key!r} (kind={extra.get('kind')!r}); prepare the data with "
            "`python -m trainer.data.prepare`"
        )
    return extra[key]


def _strs(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in list(value))


def _item(value: Mapping[str, Any]) -> HistoryItem:
    return HistoryItem(context=str(value.get("context") or ""), text=str(value.get("text") or ""))


def _rubric(extra: Mapping[str, Any], text: str) -> RubricScoreSpec:
    agg = str(extra.get("aggregate") or "")
    return RubricScoreSpec(
        context=str(_get(extra, "target")["context"] or ""),
        text=text,
        rules=_strs(_get(extra, "rules")),
        task=Task(str(extra.get("task") or "generic")),
        aggregate=RubricAggregate(agg) if agg else None,
    )


def _nli(extra: Mapping[str, Any], text: str) -> NliConstraintsSpec:
    fn = str(extra.get("nli_reward_function") or "")
    return NliConstraintsSpec(
        response=text,
        answer=str(_get(extra, "answer")),
        preference=str(_get(extra, "preference")),
        reward_function=NliRewardFunction(fn) if fn else None,
    )


def spec_from_extra_info(extra: Mapping[str, Any], solution_str: str) -> ItemSpec:
    """The reward item for one rollout ``solution_str`` of the row described by ``extra``."""
    kind = str(extra.get("kind") or "")
    if kind == RewardKind.PARL_REWARD.value:
        return ParlRewardSpec(
            history=tuple(_item(h) for h in _get(extra, "history")),
            policy_output=solution_str,
            target=_item(_get(extra, "target")),
            baselines=_strs(extra.get("baselines") or ()),
            variant=ParlVariant(str(_get(extra, "variant"))),
            task=Task(str(extra.get("task") or "generic")),
        )
    if kind == "rubric_score":
        return _rubric(extra, solution_str)
    if kind == "nli_constraints":
        return _nli(extra, solution_str)
    if kind == "weighted":
        w = _get(extra, "weights")
        return WeightedSpec(parts=(
            WeightedPart(float(w["rubric_score"]), _rubric(extra, solution_str)),
            WeightedPart(float(w["nli_constraints"]), _nli(extra, solution_str)),
        ))
    raise ExtraInfoError(
        f"extra_info kind={kind!r} is not one of {sorted(COMPONENT_KEYS)}; prepare the data with "
        "`python -m trainer.data.prepare`"
    )
