"""Protobuf <-> domain conversion, one message at a time. Structural problems (no reward kind,
unset enum) raise :class:`InvalidRequest` naming the item and field; semantic checks (counts,
texts, judgments) live in the service's validation, which
:func:`reward_server.api.score_call.score_items` runs item by item as it converts. A
ScoreItem's ``oneof kind`` field is the value of its :class:`~reward_server.domain.RewardKind`;
the conversions below ``match`` on it (mypy checks each is exhaustive).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, assert_never

from reward_server import domain as d
from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server.errors import InvalidRequest, quote

V = TypeVar("V")

_TASK = {
    pb.TASK_UNSPECIFIED: d.Task.GENERIC,
    pb.TASK_GENERIC: d.Task.GENERIC,
    pb.TASK_AMAZON: d.Task.AMAZON,
    pb.TASK_NEWS: d.Task.NEWS,
    pb.TASK_REDDIT: d.Task.REDDIT,
}
_TASK_OUT = {v: k for k, v in _TASK.items() if k != pb.TASK_UNSPECIFIED}
_VARIANT = {
    pb.PARL_VARIANT_0: d.ParlVariant.PARL_0,
    pb.PARL_VARIANT_A: d.ParlVariant.PARL_A,
    pb.PARL_VARIANT_B: d.ParlVariant.PARL_B,
}
_VARIANT_OUT = {v: k for k, v in _VARIANT.items()}
_AGGREGATE = {
    pb.RUBRIC_AGGREGATE_UNSPECIFIED: None,
    pb.RUBRIC_AGGREGATE_MEAN_P_YES: d.RubricAggregate.MEAN_P_YES,
    pb.RUBRIC_AGGREGATE_FRACTION_SATISFIED: d.RubricAggregate.FRACTION_SATISFIED,
    pb.RUBRIC_AGGREGATE_ALL_SATISFIED: d.RubricAggregate.ALL_SATISFIED,
}
_AGGREGATE_OUT = {v: k for k, v in _AGGREGATE.items()}
_NLI_FN = {
    pb.NLI_REWARD_FUNCTION_UNSPECIFIED: None,
    pb.NLI_REWARD_FUNCTION_REGIME: d.NliRewardFunction.REGIME,
    pb.NLI_REWARD_FUNCTION_ALIGNED_ONLY: d.NliRewardFunction.ALIGNED_ONLY,
    pb.NLI_REWARD_FUNCTION_PRODUCT: d.NliRewardFunction.PRODUCT,
    pb.NLI_REWARD_FUNCTION_WEIGHTED_SUM: d.NliRewardFunction.WEIGHTED_SUM,
}
_NLI_FN_OUT = {v: k for k, v in _NLI_FN.items()}
_REGIME_OUT = {
    d.Regime.PERSONALIZATION: pb.REGIME_PERSONALIZATION,
    d.Regime.GENERALIZATION: pb.REGIME_GENERALIZATION,
    d.Regime.SYCOPHANCY: pb.REGIME_SYCOPHANCY,
    d.Regime.FAILURE: pb.REGIME_FAILURE,
}
REGIME_IN = {v: k for k, v in _REGIME_OUT.items()}
_STATUS_OUT = {d.ItemStatus.OK: pb.ITEM_STATUS_OK, d.ItemStatus.POLICY_INVALID: pb.ITEM_STATUS_POLICY_INVALID}
STATUS_IN = {v: k for k, v in _STATUS_OUT.items()}


def _enum(table: Mapping[Any, V], value: int, where: str, name: str) -> V:
    try:
        return table[value]
    except KeyError:
        raise InvalidRequest(f"{where}: unknown {name} value {value}; see reward.v1 {name}") from None


def task_from_proto(value: int, where: str) -> d.Task:
    return _enum(_TASK, value, f"{where}.task", "Task")


def task_to_proto(task: d.Task) -> pb.Task:
    return _TASK_OUT[task]


def history_from_proto(items: Sequence[pb.HistoryItem]) -> tuple[d.HistoryItem, ...]:
    return tuple(d.HistoryItem(context=h.context, text=h.text) for h in items)


def _history_out(items: Sequence[d.HistoryItem]) -> list[pb.HistoryItem]:
    return [pb.HistoryItem(context=h.context, text=h.text) for h in items]


def _leaf_from_proto(
    msg: pb.ScoreItem | pb.WeightedPart, case: str | None, where: str, strings: dict[str, str] | None = None
) -> d.LeafSpec:
    """The leaf spec in ``msg``'s ``oneof kind`` field ``case`` (a RewardKind's value).
    ``strings``: one request's rules seen so far (see :func:`item_from_proto`)."""
    kind = d.RewardKind(case) if case else None
    match kind:
        case d.RewardKind.RUBRIC_SCORE:
            r = msg.rubric_score
            return d.RubricScoreSpec(
                context=r.context,
                text=r.text,
                rules=tuple(r.rules) if strings is None else tuple(strings.setdefault(x, x) for x in r.rules),
                task=task_from_proto(r.task, f"{where}.rubric_score"),
                aggregate=_enum(_AGGREGATE, r.aggregate, f"{where}.rubric_score.aggregate", "RubricAggregate"),
            )
        case d.RewardKind.PARL_REWARD:
            p = msg.parl_reward
            if p.variant == pb.PARL_VARIANT_UNSPECIFIED:
                raise InvalidRequest(
                    f"{where}.parl_reward.variant: must be set to PARL_VARIANT_0, _A or _B"
                )
            variant = _enum(_VARIANT, p.variant, f"{where}.parl_reward.variant", "ParlVariant")
            return d.ParlRewardSpec(
                history=history_from_proto(p.history),
                policy_output=p.policy_output,
                target=d.HistoryItem(context=p.target.context, text=p.target.text),
                baselines=tuple(p.baselines),
                variant=variant,
                task=task_from_proto(p.task, f"{where}.parl_reward"),
            )
        case d.RewardKind.NLI_CONSTRAINTS:
            n = msg.nli_constraints
            fn = _enum(_NLI_FN, n.reward_function, f"{where}.nli_constraints.reward_function", "NliRewardFunction")
            return d.NliConstraintsSpec(
                response=n.response, answer=n.answer, preference=n.preference, reward_function=fn
            )
        case d.RewardKind.WEIGHTED:  # pragma: no cover - a WeightedPart has no weighted field
            raise InvalidRequest(f"{where}: combinations do not nest")
        case None:
            fields = msg.DESCRIPTOR.oneofs_by_name["kind"].fields
            raise InvalidRequest(
                f"{where}: no reward kind set; set one of {', '.join(f.name for f in fields)}"
            )
        case _:
            assert_never(kind)


# An item sent without an id is called "#<index>"; callers cannot use that form themselves.
AUTO_ID = re.compile(r"#[0-9]+")


def item_from_proto(msg: pb.ScoreItem, index: int, strings: dict[str, str] | None = None) -> d.ScoreItem:
    where = f"items[{index}]" + (f" (id {quote(msg.id)})" if msg.id else "")
    if AUTO_ID.fullmatch(msg.id):
        raise InvalidRequest(
            f"items[{index}].id: {quote(msg.id)} has the form '#<index>', reserved for the ids "
            "of items sent without one; choose another id"
        )
    kind = msg.WhichOneof("kind")
    spec: d.ItemSpec
    if kind == d.RewardKind.WEIGHTED.value:
        parts = []
        for j, part in enumerate(msg.weighted.parts):
            leaf = _leaf_from_proto(part, part.WhichOneof("kind"), f"{where}.weighted.parts[{j}]", strings)
            parts.append(d.WeightedPart(weight=part.weight, spec=leaf))
        spec = d.WeightedSpec(parts=tuple(parts))
    else:
        spec = _leaf_from_proto(msg, kind, where, strings)
    return d.ScoreItem(item_id=msg.id or f"#{index}", spec=spec)


def _leaf_to_proto(spec: d.LeafSpec, msg: pb.ScoreItem | pb.WeightedPart) -> None:
    match spec:
        case d.RubricScoreSpec():
            msg.rubric_score.CopyFrom(
                pb.RubricScore(
                    context=spec.context,
                    text=spec.text,
                    rules=list(spec.rules),
                    task=task_to_proto(spec.task),
                    aggregate=_AGGREGATE_OUT[spec.aggregate],
                )
            )
        case d.ParlRewardSpec():
            msg.parl_reward.CopyFrom(
                pb.ParlReward(
                    history=_history_out(spec.history),
                    policy_output=spec.policy_output,
                    target=pb.HistoryItem(context=spec.target.context, text=spec.target.text),
                    baselines=list(spec.baselines),
                    variant=_VARIANT_OUT[spec.variant],
                    task=task_to_proto(spec.task),
                )
            )
        case d.NliConstraintsSpec():
            msg.nli_constraints.CopyFrom(
                pb.NliConstraints(
                    response=spec.response,
                    answer=spec.answer,
                    preference=spec.preference,
                    reward_function=_NLI_FN_OUT[spec.reward_function],
                )
            )
        case _:
            assert_never(spec)


def item_to_proto(item: d.ScoreItem) -> pb.ScoreItem:
    msg = pb.ScoreItem(id=item.item_id)
    match item.spec:
        case d.WeightedSpec(parts=parts):
            for part in parts:
                _leaf_to_proto(part.spec, msg.weighted.parts.add(weight=part.weight))
            if not parts:
                msg.weighted.SetInParent()
        case d.RubricScoreSpec() | d.ParlRewardSpec() | d.NliConstraintsSpec() as leaf:
            _leaf_to_proto(leaf, msg)
        case _:
            assert_never(item.spec)
    return msg


def result_to_proto(result: d.ItemResult) -> pb.ItemResult:
    msg = pb.ItemResult(
        id=result.item_id,
        status=_STATUS_OUT[result.status],
        components=dict(result.components),
        timings_ms=dict(result.timings_ms),
        message=result.message,
    )
    if result.reward is not None:
        msg.reward = result.reward
    return msg


def result_from_proto(msg: pb.ItemResult) -> d.ItemResult:
    return d.ItemResult(
        item_id=msg.id,
        status=STATUS_IN.get(msg.status, d.ItemStatus.OK),
        reward=msg.reward if msg.HasField("reward") else None,
        components=dict(msg.components),
        timings_ms=dict(msg.timings_ms),
        message=msg.message,
    )


def induction_to_proto(result: d.InductionResult) -> pb.InduceRubricsResponse:
    return pb.InduceRubricsResponse(
        rules=list(result.rules),
        covered=result.covered,
        best_attempt=result.best_attempt,
        attempts=[
            pb.InductionAttempt(
                raw_output=a.raw_output,
                parsed_rules=list(a.parsed_rules),
                valid_rules=list(a.valid_rules),
                invalid_reason=a.invalid_reason or "",
            )
            for a in result.attempts
        ],
    )


def induction_from_proto(msg: pb.InduceRubricsResponse) -> d.InductionResult:
    return d.InductionResult(
        rules=tuple(msg.rules),
        covered=msg.covered,
        best_attempt=msg.best_attempt,
        attempts=tuple(
            d.InductionAttempt(
                raw_output=a.raw_output,
                parsed_rules=tuple(a.parsed_rules),
                valid_rules=tuple(a.valid_rules),
                invalid_reason=a.invalid_reason or None,
            )
            for a in msg.attempts
        ),
    )


def verification_to_proto(v: d.Verification) -> pb.VerifyResponse:
    return pb.VerifyResponse(
        s_correct=v.s_correct,
        s_aligned=v.s_aligned,
        regime=_REGIME_OUT[v.regime],
        truncated=v.truncated,
        evidence=[
            pb.ConstraintEvidence(
                constraint=e.constraint,
                score=e.score,
                premise_units=list(e.premise_units),
                hypothesis_units=list(e.hypothesis_units),
                critical_premise=list(e.critical_premise),
                critical_hypothesis=list(e.critical_hypothesis),
                pairs=[
                    pb.EvidencePair(premise_index=p.premise_index, hypothesis_index=p.hypothesis_index)
                    for p in e.pairs
                ],
            )
            for e in v.evidence
        ],
    )


def verification_from_proto(msg: pb.VerifyResponse) -> d.Verification:
    return d.Verification(
        s_correct=msg.s_correct,
        s_aligned=msg.s_aligned,
        regime=REGIME_IN[msg.regime],
        truncated=msg.truncated,
        evidence=tuple(
            d.ConstraintEvidence(
                constraint=e.constraint,
                score=e.score,
                premise_units=tuple(e.premise_units),
                hypothesis_units=tuple(e.hypothesis_units),
                critical_premise=tuple(e.critical_premise),
                critical_hypothesis=tuple(e.critical_hypothesis),
                pairs=tuple(d.EvidencePair(p.premise_index, p.hypothesis_index) for p in e.pairs),
            )
            for e in msg.evidence
        ),
    )


def info_to_proto(info: d.ServerInfo) -> pb.InfoResponse:
    return pb.InfoResponse(
        api_version=info.api_version,
        server_version=info.server_version,
        judge_model=info.judge_model,
        nli_model=info.nli_model,
        template_versions=dict(info.template_versions),
        settings=dict(info.settings),
        components=[
            pb.RewardKindComponents(
                kind=kind,
                components=[pb.RewardComponent(name=c.name, meaning=c.meaning) for c in comps],
            )
            for kind, comps in info.components.items()
        ],
        fake_engines=info.fake_engines,
    )


def info_from_proto(msg: pb.InfoResponse) -> d.ServerInfo:
    return d.ServerInfo(
        api_version=msg.api_version,
        server_version=msg.server_version,
        judge_model=msg.judge_model,
        nli_model=msg.nli_model,
        template_versions=dict(msg.template_versions),
        settings=dict(msg.settings),
        components={
            k.kind: tuple(d.ComponentInfo(c.name, c.meaning) for c in k.components)
            for k in msg.components
        },
        fake_engines=msg.fake_engines,
    )
