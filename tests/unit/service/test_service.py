"""Orchestration on the fakes: the one policy-invalid penalty, limits from ServiceSettings,
Info from the service's settings and the engines."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

import pytest

from reward_server.backends.base import JudgePrompt
from reward_server.backends.fake import FakeJudge, FakeNLI
from reward_server.domain import (
    HistoryItem,
    ItemResult,
    ItemStatus,
    NliConstraintsSpec,
    ParlRewardSpec,
    ParlVariant,
    RubricScoreSpec,
    ScoreItem,
    WeightedPart,
    WeightedSpec,
)
from reward_server.errors import EngineError, InvalidRequest
from reward_server.kinds.weighted import weighted_mean
from reward_server.service import Limits, RewardService, ServiceSettings

RULE = 'The text uses the word "alpha".'
NLI = NliConstraintsSpec("Paris is big.", "Paris", "big")


async def score(s: RewardService, items: list[ScoreItem]) -> list[ItemResult]:
    """Validate, then score: what every transport does."""
    return await s.score(await s.validate(items))


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
    by = {r.item_id: r for r in await score(s, items)}
    for key in ("parl", "rubric", "nli"):
        assert by[key].status is ItemStatus.POLICY_INVALID and by[key].reward == -0.5, key
        assert by[key].message
    assert by["parl"].components["floor_applied"] == 1.0  # the science's counts survive
    assert by["good"].status is ItemStatus.OK and by["good"].reward == pytest.approx(0.98)


async def test_limits_come_from_the_service_settings() -> None:
    s = RewardService(judge=FakeJudge(), nli=FakeNLI(),
                      settings=ServiceSettings(limits=Limits(max_batch_items=2, max_text_bytes=10)))
    with pytest.raises(InvalidRequest, match=r"service\.limits\.max_batch_items=2"):
        await score(s, [ScoreItem(str(i), RubricScoreSpec("c", "alpha", (RULE,))) for i in range(3)])
    with pytest.raises(InvalidRequest, match=r"rules\[0\]: 11 bytes exceed service\.limits\.max_text_bytes=10"):
        await score(s, [ScoreItem("a", RubricScoreSpec("c", "alpha", ("x" * 11,)))])
    # bytes, not characters: 4 characters of 3 bytes each
    with pytest.raises(InvalidRequest, match=r"12 bytes exceed"):
        await score(s, [ScoreItem("a", RubricScoreSpec("c", "alpha", ("\u20ac" * 4,)))])
    assert (await score(s, [ScoreItem("a", RubricScoreSpec("c", "alpha", ("\u20ac" * 3,)))]))[0]


H = (HistoryItem("c", "alpha"),)
CAPS = {
    "max_id_bytes": (3, ScoreItem("abcd", RubricScoreSpec("c", "alpha", (RULE,))),
                     r"items\[0\]\.id: 4 bytes exceed service\.limits\.max_id_bytes=3"),
    "max_rules_per_item": (2, ScoreItem("a", RubricScoreSpec("c", "alpha", (RULE,) * 3)),
                           r"rubric_score\.rules: 3 entries exceed service\.limits\.max_rules_per_item=2"),
    "max_history_items": (1, ScoreItem("a", ParlRewardSpec(H * 2, "[]", H[0], ("b",), ParlVariant.PARL_A)),
                          r"parl_reward\.history: 2 entries exceed service\.limits\.max_history_items=1"),
    "max_baselines": (1, ScoreItem("a", ParlRewardSpec(H, "[]", H[0], ("b", "c"), ParlVariant.PARL_A)),
                      r"parl_reward\.baselines: 2 entries exceed service\.limits\.max_baselines=1"),
    "max_weighted_parts": (1, ScoreItem("a", WeightedSpec((WeightedPart(1.0, NLI),) * 2)),
                           r"weighted\.parts: 2 entries exceed service\.limits\.max_weighted_parts=1"),
    "max_judgments_per_request": (
        3, ScoreItem("a", RubricScoreSpec("c", "alpha", (RULE,) * 4)),
        r"items: needs about 4 judgments .*max_judgments_per_request=3"),
}


@pytest.mark.parametrize("cap", list(CAPS))
async def test_each_cap_is_refused_naming_the_field_and_the_limit(cap: str) -> None:
    limit, item, needle = CAPS[cap]
    s = service(limits=Limits(**{cap: limit}))
    with pytest.raises(InvalidRequest, match=needle):
        await score(s, [item])
    assert len(await score(service(), [item])) == 1  # the default allows it


async def test_messages_quote_a_bounded_excerpt_of_a_long_id() -> None:
    long_id = "x" * 100_000
    with pytest.raises(InvalidRequest) as e:
        await score(service(limits=Limits(max_id_bytes=200_000)),
                    [ScoreItem(long_id, NLI), ScoreItem(long_id, NLI)])
    assert "duplicate id" in str(e.value) and len(str(e.value)) < 300


@pytest.mark.parametrize("weights", [(1e308, 1e308, 1e308), (1e308, 5e-324), (5e-324,), (0.0, 1e-300)])
async def test_extreme_finite_weights_give_a_finite_weighted_reward(weights: tuple[float, ...]) -> None:
    item = ScoreItem("w", WeightedSpec(tuple(WeightedPart(w, NLI) for w in weights)))
    [r, alone] = await score(service(), [item, ScoreItem("alone", NLI)])
    assert r.status is ItemStatus.OK and r.reward == pytest.approx(alone.reward)  # parts alike


@pytest.mark.parametrize(("weights", "values", "mean"), [
    ((1.0, 3.0), (0.0, 1.0), 0.75), ((1e308, 1e308), (2.0, 4.0), 3.0), ((2.0, 0.0), (5.0, 1e6), 5.0)])
def test_weighted_mean(weights: tuple[float, ...], values: tuple[float, ...], mean: float) -> None:
    assert weighted_mean(weights, values) == pytest.approx(mean)


def test_info_reports_settings_components_and_fakes() -> None:
    info = RewardService(judge=FakeJudge(), nli=FakeNLI(), fake_engines=True).info()
    assert info.fake_engines is True and info.settings["engines.fake"] == "true"
    assert info.settings["service.policy_invalid_penalty"] == "0.0"
    assert info.settings["service.limits.max_batch_items"] == "1024"
    for name in Limits.model_fields:  # every limit is reported
        assert info.settings[f"service.limits.{name}"] == str(getattr(Limits(), name))
    assert info.settings["service.admission.enabled"] == "true"
    assert int(info.settings["service.admission.max_judgments_in_flight"]) > 0
    assert {"rubric_score", "parl_reward", "nli_constraints", "weighted"} == set(info.components)
    assert not RewardService(judge=FakeJudge(), nli=FakeNLI()).info().fake_engines


def test_a_batch_checked_as_it_arrives_is_validated_only_when_seen_whole() -> None:
    s = service()
    items = [ScoreItem("a", NLI), ScoreItem("b", NLI)]
    check = s.batch_check()
    check.size(len(items))
    check.item(items[0], 0)
    with pytest.raises(RuntimeError, match="not every item"):
        check.done(items)
    check.item(items[1], 1)
    batch = check.done(items)
    assert batch.items == tuple(items) and batch.judgments == 4


async def test_induction_resolves_the_default_sample_count_once() -> None:
    s = service()
    plan = s.validator.induce(H, num_samples=0)
    assert plan.samples == s.rubric.induction_samples
    assert s.validator.induce(H, num_samples=3).samples == 3


@pytest.mark.parametrize("weighted", [False, True])
async def test_a_history_over_its_limit_is_refused_before_it_is_converted(weighted: bool) -> None:
    from reward_server._proto.reward.v1 import reward_pb2 as pb
    from reward_server.api import score_call

    parl = pb.ParlReward(policy_output="[]", variant=pb.PARL_VARIANT_A, baselines=["b"],
                         target=pb.HistoryItem(text="t"),
                         history=[pb.HistoryItem(text="h")] * 5000)
    item = (pb.ScoreItem(id="a", weighted=pb.WeightedCombination(parts=[pb.WeightedPart(weight=1, parl_reward=parl)]))
            if weighted else pb.ScoreItem(id="a", parl_reward=parl))
    raw = pb.ScoreRequest(items=[item]).SerializeToString()
    where = r"items\[0\]\.weighted\.parts\[0\]\.parl_reward" if weighted else r"items\[0\]\.parl_reward"
    # the proto's path, not the converted item's ("items[0] (id ...)"): counted before conversion
    with pytest.raises(InvalidRequest, match=where + r"\.history: 5000 entries exceed "
                       r"service\.limits\.max_history_items=64"):
        await score_call.score_items(raw, service().batch_check())


class CountingJudge(FakeJudge):
    """FakeJudge's answers, a moment late, counting the prompts in flight at once; a prompt
    whose rule says "boom" fails its call."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = self.most = self.calls = 0

    async def p_yes(self, prompts: Sequence[JudgePrompt]) -> list[float]:
        self.calls += 1
        self.in_flight += len(prompts)
        self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(0.001)
            if any("boom" in p.suffix for p in prompts):
                raise EngineError("the judge failed on purpose")
            return await super().p_yes(prompts)
        finally:
            self.in_flight -= len(prompts)


def rubric_items(n: int, rules: int) -> list[ScoreItem]:
    return [ScoreItem(f"i{i}", RubricScoreSpec("c", "alpha" if i % 2 else "beta",
                                               tuple(f'The text uses the word "{w}".' for w in
                                                     ("alpha", "beta", "gamma", "delta", "eps")[:rules])))
            for i in range(n)]


async def test_a_large_call_keeps_at_most_its_window_of_judgments_in_flight() -> None:
    items = rubric_items(12, 3)  # 36 judgments, 3 per item
    windowed, whole = CountingJudge(), CountingJudge()
    small = RewardService(judge=windowed, nli=FakeNLI(), settings=ServiceSettings(call_judgments_in_flight=8))
    big = RewardService(judge=whole, nli=FakeNLI())
    got = await score(small, items)
    assert [r.item_id for r in got] == [i.item_id for i in items]  # in order
    assert got == [dataclasses.replace(r, timings_ms=g.timings_ms)
                   for r, g in zip(await score(big, items), got, strict=True)]
    assert windowed.most == 6  # two items of 3: a third would make 9 > 8
    assert whole.most == 36  # the default window (4 x 512) holds the whole call


async def test_an_item_larger_than_the_window_runs_alone() -> None:
    judge = CountingJudge()
    s = RewardService(judge=judge, nli=FakeNLI(), settings=ServiceSettings(call_judgments_in_flight=2))
    got = await score(s, rubric_items(4, 5))
    assert judge.most == 5 and len(got) == 4 and all(r.status is ItemStatus.OK for r in got)


async def test_a_failed_item_in_a_windowed_call_stops_the_items_not_yet_started() -> None:
    judge = CountingJudge()
    s = RewardService(judge=judge, nli=FakeNLI(), settings=ServiceSettings(call_judgments_in_flight=3))
    items = rubric_items(10, 1)
    items[1] = ScoreItem("bad", RubricScoreSpec("c", "alpha", ('The text says "boom".',)))
    with pytest.raises(EngineError, match="on purpose"):
        await score(s, items)
    assert judge.calls < len(items) and judge.in_flight == 0
