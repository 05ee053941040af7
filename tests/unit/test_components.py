"""The one declaration of reward components (reward_server.components, named per kind by
reward_server.api.kinds.FACTS) holds: every science output reports only declared names, the
full paths report every fixed one, the service's weighted items follow the part rule, and what
a trainer logs for an item of any shape is the declared fixed names of its own kinds."""

from __future__ import annotations

import json

import pytest

from reward_server.api import kinds as k
from reward_server.api.convert import item_to_proto
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
)
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
    undeclared = sorted(n for n in names if not k.is_declared(kind, n))
    assert undeclared == [], f"{kind.value} reports undeclared components {undeclared}"
    if full:
        missing = sorted(set(k.FACTS[kind].fixed_names) - names)
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
    assert set(k.component_names(item_to_proto(ScoreItem("w", spec)))) <= set(result.components)


def test_is_declared_refuses_unknown_names() -> None:
    assert k.is_declared(RewardKind.PARL_REWARD, "s_baseline.12")
    assert not k.is_declared(RewardKind.PARL_REWARD, "s_baseline.x")
    assert not k.is_declared(RewardKind.RUBRIC_SCORE, "s_target")
    assert k.is_declared(RewardKind.WEIGHTED, "part3.regime.failure")
    assert not k.is_declared(RewardKind.WEIGHTED, "part0.bogus")


def test_what_a_trainer_logs_is_read_from_the_items_own_shape() -> None:
    def names(spec: object) -> tuple[str, ...]:
        return k.component_names(item_to_proto(ScoreItem("x", spec)))  # type: ignore[arg-type]

    for spec in (RUBRIC, parl("[]"), NLI):
        kind = k.of_message(item_to_proto(ScoreItem("x", spec)))
        assert kind is not None and names(spec) == kind.fixed_names
    parts = [(RUBRIC, RewardKind.RUBRIC_SCORE), (parl("[]"), RewardKind.PARL_REWARD),
             (NLI, RewardKind.NLI_CONSTRAINTS)]
    for (a, ka), (b, kb) in ((x, y) for x in parts for y in parts):
        got = names(WeightedSpec((WeightedPart(1.0, a), WeightedPart(1.0, b))))
        assert got == ("part0.reward", "part0.weight",
                       *(f"part0.{n}" for n in k.FACTS[ka].fixed_names),
                       "part1.reward", "part1.weight",
                       *(f"part1.{n}" for n in k.FACTS[kb].fixed_names))
    # the combination of the issue: PARL's own components, none of the rubric score's
    parl_nli = names(WeightedSpec((WeightedPart(1.0, parl("[]")), WeightedPart(1.0, NLI))))
    assert "part0.s_target" in parl_nli and "part0.mean_p_yes" not in parl_nli


@pytest.mark.parametrize("kind", list(RewardKind))
def test_info_serves_every_kind_with_meanings(kind: RewardKind) -> None:
    served = k.info()[kind.value]
    assert [x.name for x in served] == [x.name for x in k.FACTS[kind].components]
    assert all(x.meaning for x in served)


def test_an_indexed_familys_names_are_shared_not_rebuilt_per_result() -> None:
    from reward_server.components import RubricScore

    assert RubricScore.P_YES.at(3) == "p_yes.3" and RubricScore.P_YES.at(3) is RubricScore.P_YES.at(3)
    assert RubricScore.P_YES.at(100_000) == "p_yes.100000"  # past the shared ones: built
