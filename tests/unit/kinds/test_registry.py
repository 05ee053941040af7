"""The reward-kind registry: every kind is declared once and completely, dispatch finds it for
every spec, each kind's validation counts its judgments, and the service scores through it."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from reward_server import domain as d
from reward_server import kinds
from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server.api.kinds import FACTS, is_declared
from reward_server.backends.fake import FakeJudge, FakeNLI
from reward_server.errors import InvalidRequest
from reward_server.nli.settings import NLISettings
from reward_server.rubric.settings import RubricSettings
from reward_server.service import Limits, RewardService, Validator

RULE = 'The text uses the word "alpha".'
H = (d.HistoryItem("c", "alpha"), d.HistoryItem("c", "alpha beta"))
RUBRIC = d.RubricScoreSpec("ctx", "alpha here", (RULE, RULE, RULE))
PARL = d.ParlRewardSpec(H, "[]", d.HistoryItem("t", "alpha"), ("b1", "b2"), d.ParlVariant.PARL_A)
NLI = d.NliConstraintsSpec("Paris is big.", "Paris", "big")
WEIGHTED = d.WeightedSpec((d.WeightedPart(1.0, RUBRIC), d.WeightedPart(2.0, NLI)))
SPECS: dict[d.RewardKind, d.ItemSpec] = {
    d.RewardKind.RUBRIC_SCORE: RUBRIC, d.RewardKind.PARL_REWARD: PARL,
    d.RewardKind.NLI_CONSTRAINTS: NLI, d.RewardKind.WEIGHTED: WEIGHTED,
}


def test_every_reward_kind_is_declared_once_with_the_declared_components() -> None:
    assert set(kinds.KINDS) == set(d.RewardKind) == set(FACTS)
    assert {k.spec for k in kinds.KINDS.values()} == set(typing.get_args(d.ItemSpec))  # of() is total
    for kind, decl in kinds.KINDS.items():
        assert decl.kind is kind
        assert decl.facts is FACTS[kind] and decl.components == FACTS[kind].components


def test_each_kind_names_its_proto_field_and_response_field() -> None:
    oneof = {f.name for f in pb.ScoreItem.DESCRIPTOR.oneofs_by_name["kind"].fields}
    assert {d.proto_field for d in kinds.KINDS.values()} == oneof
    for decl in kinds.KINDS.values():
        fields = {f.name: f for f in dataclasses.fields(decl.spec)}  # type: ignore[arg-type]
        if decl.response_field is None:  # a combination: each part has its own
            assert decl.kind is d.RewardKind.WEIGHTED
            continue
        assert decl.response_field in fields
        proto = getattr(pb.ScoreItem(), decl.proto_field)
        assert decl.response_field in type(proto).DESCRIPTOR.fields_by_name  # the same name on the wire


def test_dispatch_finds_the_kind_of_every_spec() -> None:
    for kind, spec in SPECS.items():
        assert kinds.of(spec) is kinds.KINDS[kind]
        assert d.kind_of(spec) is kind
    assert kinds.KINDS[d.RewardKind.PARL_REWARD].response(PARL) == "[]"
    with pytest.raises(TypeError, match="no response field"):
        kinds.KINDS[d.RewardKind.WEIGHTED].response(WEIGHTED)


def test_each_kind_counts_its_judgments() -> None:
    rubric = RubricSettings()
    v = Validator(Limits(), rubric, NLISettings())
    assert v.spec(RUBRIC, "x") == kinds.Work(judge=3)  # one judge prompt per rule
    assert v.spec(NLI, "x") == kinds.Work(nli=2)  # two NLI pairs
    # an upper bound: max_rules rules on each judged history text, the target and each baseline
    assert v.spec(PARL, "x") == kinds.Work(judge=rubric.max_rules * (len(H) + 1 + 2))
    assert v.spec(WEIGHTED, "x") == kinds.Work(judge=3, nli=2)  # the parts' sum
    assert v.spec(WEIGHTED, "x").judgments == 5


def test_validation_names_the_kind_field_of_the_item() -> None:
    v = Validator(Limits(), RubricSettings(), NLISettings())
    with pytest.raises(InvalidRequest, match=r"^items\[0\]\.rubric_score\.rules: needs at least one rule"):
        v.spec(d.RubricScoreSpec("c", "t", ()), "items[0]")
    with pytest.raises(InvalidRequest, match=r"^items\[0\]\.weighted\.parts\[1\]\.nli_constraints\.answer"):
        v.spec(d.WeightedSpec((d.WeightedPart(1.0, NLI), d.WeightedPart(1.0, d.NliConstraintsSpec("r", "", "p")))),
               "items[0]")


async def test_the_service_scores_every_kind_through_its_declaration() -> None:
    s = RewardService(judge=FakeJudge(), nli=FakeNLI())
    batch = await s.validate([d.ScoreItem(k.value, spec) for k, spec in SPECS.items()])
    assert batch.judgments == sum(s.validator.spec(spec, "x").judgments for spec in SPECS.values())
    assert batch.nli_pairs == 2 + 2  # the NLI item's and the weighted item's NLI part
    for result, (kind, _spec) in zip(await s.score(batch), SPECS.items(), strict=True):
        assert result.item_id == kind.value and result.reward is not None
        assert all(is_declared(kind, name) for name in result.components)


async def test_an_empty_response_is_penalised_under_its_kind_field_name() -> None:
    s = RewardService(judge=FakeJudge(), nli=FakeNLI())
    for spec, where in ((dataclasses.replace(RUBRIC, text=" "), "rubric_score.text"),
                        (dataclasses.replace(PARL, policy_output=""), "parl_reward.policy_output"),
                        (dataclasses.replace(NLI, response=""), "nli_constraints.response")):
        outcome = await s.leaf(spec)
        assert outcome.policy_invalid == f"{where} is empty"
        assert outcome.reward == s.settings.policy_invalid_penalty
