"""The one declaration of reward components (reward_server.components) holds: every science
output reports only declared names, the full paths report every fixed one, the service's
weighted items follow the part rule, and the trainer logs exactly the declared fixed names."""

from __future__ import annotations

import json

import pytest

from reward_server import components as c
from reward_server.backends.fake import FakeJudge, FakeNLI
from reward_server.domain import (
    HistoryItem,
    NliConstraintsSpec,
    ParlRewardSpec,
    ParlVariant,
    RewardKind,
    RubricScoreSpec,
    ScoreItem,
    WeightedPart,
    WeightedSpec,
    kind_of,
)
from reward_server.integrations.extra_info import COMPONENT_KEYS, WEIGHTED_PARTS
from reward_server.nli import NLISettings, nli_constraints_reward
from reward_server.rubric import RubricSettings, parl_reward, score_rubric
from reward_server.service import RewardService

R1, R2 = 'The text uses the word "alpha".', 'The text uses the word "beta".'
HISTORY = (HistoryItem("c", "alpha beta"), HistoryItem("c", "alpha beta gamma"))
RUBRIC = RubricScoreSpec("ctx", "alpha here", (R1, R2))
NLI = NliConstraintsSpec("Paris is big. Museums too.", "Paris", "museums")


def parl(output: str) -> ParlRewardSpec:
    return ParlRewardSpec(HISTORY, output, HistoryItem("t", "alpha"), ("beta", "none"), ParlVariant.PARL_A)


def check(kind: RewardKind, names: set[str], *, full: bool) -> None:
    undeclared = sorted(n for n in names if not c.is_declared(kind, n))
    assert undeclared == [], f"{kind.value} reports undeclared components {undeclared}"
    if full:
        missing = sorted(set(c.fixed_names(kind)) - names)
        assert missing == [], f"{kind.value} does not report declared components {missing}"


async def test_science_reports_exactly_the_declared_components() -> None:
    judge, settings = FakeJudge(), RubricSettings()
    out = await score_rubric(judge, RUBRIC, settings)
    check(RewardKind.RUBRIC_SCORE, set(out.components), full=True)
    assert "p_yes.1" in out.components  # an indexed family
    out = await parl_reward(judge, parl(json.dumps([{"rule": R1}, {"rule": R2}])), settings)
    check(RewardKind.PARL_REWARD, set(out.components), full=True)
    for partial in ("not json", json.dumps([{"rule": 'Uses "zzz".'}, {"rule": 'Uses "yyy".'}])):
        out = await parl_reward(judge, parl(partial), settings)  # invalid, and floor paths
        check(RewardKind.PARL_REWARD, set(out.components), full=False)
    out = await nli_constraints_reward(FakeNLI(), NLI, NLISettings())
    check(RewardKind.NLI_CONSTRAINTS, set(out.components), full=True)


async def test_weighted_items_follow_the_part_rule() -> None:
    service = RewardService(judge=FakeJudge(), nli=FakeNLI())
    spec = WeightedSpec((WeightedPart(1.0, RUBRIC), WeightedPart(2.0, NLI)))
    (result,) = await service.score(await service.validate([ScoreItem("w", spec)]))
    check(RewardKind.WEIGHTED, set(result.components), full=False)
    assert set(c.weighted_names([kind_of(RUBRIC), kind_of(NLI)])) <= set(result.components)


def test_is_declared_refuses_unknown_names() -> None:
    assert c.is_declared(RewardKind.PARL_REWARD, "s_baseline.12")
    assert not c.is_declared(RewardKind.PARL_REWARD, "s_baseline.x")
    assert not c.is_declared(RewardKind.RUBRIC_SCORE, "s_target")
    assert c.is_declared(RewardKind.WEIGHTED, "part3.regime.failure")
    assert not c.is_declared(RewardKind.WEIGHTED, "part0.bogus")


def test_the_trainer_logs_the_declared_fixed_names() -> None:
    for kind in c.LEAF_KINDS:
        assert COMPONENT_KEYS[kind.value] == c.fixed_names(kind)
    assert COMPONENT_KEYS["weighted"] == c.weighted_names(WEIGHTED_PARTS)
    assert set(COMPONENT_KEYS) == {k.value for k in RewardKind}


@pytest.mark.parametrize("kind", list(RewardKind))
def test_info_serves_every_kind_with_meanings(kind: RewardKind) -> None:
    served = c.info()[kind.value]
    assert [x.name for x in served] == [x.name for x in c.COMPONENTS[kind]]
    assert all(x.meaning for x in served)


def test_an_indexed_familys_names_are_shared_not_rebuilt_per_result() -> None:
    from reward_server.components import RubricScore

    assert RubricScore.P_YES.at(3) == "p_yes.3" and RubricScore.P_YES.at(3) is RubricScore.P_YES.at(3)
    assert RubricScore.P_YES.at(100_000) == "p_yes.100000"  # past the shared ones: built
