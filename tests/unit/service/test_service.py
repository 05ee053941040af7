"""Orchestration on the fakes: the one policy-invalid penalty, limits from ServiceSettings,
Info from the service's settings and the engines."""

from __future__ import annotations

import pytest

from reward_server.backends.fake import FakeJudge, FakeNLI
from reward_server.domain import (
    HistoryItem,
    ItemStatus,
    NliConstraintsSpec,
    ParlRewardSpec,
    ParlVariant,
    RubricScoreSpec,
    ScoreItem,
)
from reward_server.errors import InvalidRequest
from reward_server.service import Limits, RewardService, ServiceSettings

RULE = 'The text uses the word "alpha".'


def service(**kw: object) -> RewardService:
    return RewardService(judge=FakeJudge(), nli=FakeNLI(), settings=ServiceSettings(**kw))  # type: ignore[arg-type]


async def test_one_penalty_for_every_kind_of_malformed_policy_output() -> None:
    s = service(policy_invalid_penalty=-0.5)
    items = [
        ScoreItem("parl", ParlRewardSpec((HistoryItem("c", "alpha"),), "not json", HistoryItem("t", "alpha"),
                                         ("b",), ParlVariant.PARL_A)),
        ScoreItem("rubric", RubricScoreSpec("c", "   ", (RULE,))),
        ScoreItem("nli", NliConstraintsSpec("", "Paris", "museums")),
        ScoreItem("good", RubricScoreSpec("c", "alpha", (RULE,))),
    ]
    by = {r.item_id: r for r in await s.score(items)}
    for key in ("parl", "rubric", "nli"):
        assert by[key].status is ItemStatus.POLICY_INVALID and by[key].reward == -0.5, key
        assert by[key].message
    assert by["parl"].components["floor_applied"] == 1.0  # the science's counts survive
    assert by["good"].status is ItemStatus.OK and by["good"].reward == pytest.approx(0.98)


async def test_limits_come_from_the_service_settings() -> None:
    s = RewardService(judge=FakeJudge(), nli=FakeNLI(),
                      settings=ServiceSettings(limits=Limits(max_batch_items=2, max_text_chars=10)))
    with pytest.raises(InvalidRequest, match=r"service\.limits\.max_batch_items=2"):
        await s.score([ScoreItem(str(i), RubricScoreSpec("c", "alpha", (RULE,))) for i in range(3)])
    with pytest.raises(InvalidRequest, match=r"service\.limits\.max_text_chars=10"):
        await s.score([ScoreItem("a", RubricScoreSpec("c", "alpha", ("x" * 11,)))])


def test_info_reports_settings_components_and_fakes() -> None:
    info = RewardService(judge=FakeJudge(), nli=FakeNLI(), fake_engines=True).info()
    assert info.fake_engines is True and info.settings["engines.fake"] == "true"
    assert info.settings["service.policy_invalid_penalty"] == "0.0"
    assert info.settings["service.limits.max_batch_items"] == "1024"
    assert {"rubric_score", "parl_reward", "nli_constraints", "weighted"} == set(info.components)
    assert not RewardService(judge=FakeJudge(), nli=FakeNLI()).info().fake_engines
