"""The bad-input list: each gets its status code and a message naming the field, while
concurrent good calls still succeed and the server stays up."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from reward_server import domain as d
from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server._proto.reward.v1 import reward_pb2_grpc as pb_grpc
from reward_server.backends.fake import FakeJudge
from reward_server.client import RewardCallError

from .conftest import running_server

GOOD = d.ScoreItem(
    "ok", d.NliConstraintsSpec(response="Paris is big.", answer="Paris", preference="big")
)
H = (d.HistoryItem("c", "some history text"),)


def parl(**kw: object) -> d.ParlRewardSpec:
    base: dict[str, object] = dict(
        history=H, policy_output="[]", target=d.HistoryItem("c", "target"),
        baselines=("b",), variant=d.ParlVariant.PARL_A,
    )
    base.update(kw)
    return d.ParlRewardSpec(**base)  # type: ignore[arg-type]


def nli(**kw: str) -> d.NliConstraintsSpec:
    base = dict(response="r", answer="a", preference="p")
    base.update(kw)
    return d.NliConstraintsSpec(**base)


BAD_ITEMS = {
    "empty batch": ([], "items: the batch is empty"),
    "batch over limit": ([d.ScoreItem(str(i), GOOD.spec) for i in range(9)], "max_batch_items=8"),
    "missing answer": ([d.ScoreItem("x", nli(answer=""))], "nli_constraints.answer: must not be empty"),
    "empty history text": ([d.ScoreItem("x", parl(history=(d.HistoryItem("c", ""),)))],
                           "parl_reward.history[0].text: must not be empty"),
    "text over limit": ([d.ScoreItem("x", nli(preference="p" * 2001))],
                        "nli_constraints.preference: 2001 characters exceed"),
    "no baseline for PARL-A": ([d.ScoreItem("x", parl(baselines=()))], "parl_reward.baselines"),
    "no rules": ([d.ScoreItem("x", d.RubricScoreSpec("c", "t", ()))], "rubric_score.rules"),
    "weights sum to zero": (
        [d.ScoreItem("x", d.WeightedSpec((d.WeightedPart(0.0, nli()),)))], "weights sum to 0"),
    "NaN weight": ([d.ScoreItem("x", d.WeightedSpec((d.WeightedPart(float("nan"), nli()),)))],
                   "parts[0].weight: nan"),
    "inf weight": ([d.ScoreItem("x", d.WeightedSpec((d.WeightedPart(float("inf"), nli()),)))],
                   "parts[0].weight: inf"),
    "duplicate ids": ([GOOD, GOOD], "items[1].id: duplicate id 'ok'"),
}


async def _with_concurrent_good_call(r, bad_call) -> BaseException:
    async with r.client(max_retries=0) as c:
        bad, good = await asyncio.gather(bad_call(c), c.score([GOOD]), return_exceptions=True)
        assert isinstance(good, list) and good[0].status is d.ItemStatus.OK, good
        assert await c.health() == "SERVING"
    assert isinstance(bad, BaseException), f"bad call succeeded: {bad}"
    return bad


@pytest.mark.parametrize("case", list(BAD_ITEMS), ids=list(BAD_ITEMS))
async def test_malformed_requests_are_invalid_argument(fake_server, case: str) -> None:
    items, needle = BAD_ITEMS[case]
    err = await _with_concurrent_good_call(fake_server, lambda c: c.score(items))
    assert isinstance(err, RewardCallError)
    assert err.code is grpc.StatusCode.INVALID_ARGUMENT
    assert needle in err.details, err.details


@pytest.mark.parametrize(
    ("item", "needle"),
    [
        (pb.ScoreItem(id="k"), "no reward kind set"),
        (pb.ScoreItem(id="v", parl_reward=pb.ParlReward(variant=9)), "unknown ParlVariant value 9"),
        (pb.ScoreItem(id="u", parl_reward=pb.ParlReward()), "parl_reward.variant: must be set"),
    ],
)
async def test_wire_level_errors(fake_server, item: pb.ScoreItem, needle: str) -> None:
    async with grpc.aio.insecure_channel(fake_server.target) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await pb_grpc.RewardServiceStub(ch).Score(pb.ScoreRequest(items=[item]))
    assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert needle in (e.value.details() or "")


async def test_auth() -> None:
    async with running_server(["server.auth_token=s3cret"]) as r:
        for token, ok in [(None, False), ("wrong", False), ("s3cret", True)]:
            async with r.client(token=token, max_retries=0) as c:
                if ok:
                    assert (await c.score([GOOD]))[0].status is d.ItemStatus.OK
                else:
                    with pytest.raises(RewardCallError) as e:
                        await c.info()
                    assert e.value.code is grpc.StatusCode.UNAUTHENTICATED
                    assert ("missing" if token is None else "wrong") in e.value.details
                assert await c.health() == "SERVING"  # probes need no token
    async with running_server() as r, r.client() as c:  # auth off: no token needed
        assert (await c.info()).api_version == "reward.v1"


async def test_expired_deadline_is_deadline_exceeded() -> None:
    item = d.ScoreItem("slow", d.RubricScoreSpec("c", "coffee", ('The text mentions "coffee".',)))
    async with running_server(judge=FakeJudge(latency_s=1.0)) as r:
        slow = r.client(max_retries=0)
        with pytest.raises(RewardCallError) as e:
            await slow.score([item], timeout_s=0.2)
        assert e.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
        assert (await slow.score([item], timeout_s=5.0))[0].status is d.ItemStatus.OK
        await slow.close()


async def test_message_over_max_size_is_resource_exhausted() -> None:
    async with running_server(["server.max_message_bytes=4096"]) as r:
        big = d.ScoreItem("big", d.NliConstraintsSpec(response="r " * 3000, answer="a", preference="p"))
        err = await _with_concurrent_good_call(r, lambda c: c.score([big]))
    assert isinstance(err, RewardCallError)
    assert err.code is grpc.StatusCode.RESOURCE_EXHAUSTED
