"""The bad-input list: each gets its status code and a message naming the field, while
concurrent good calls still succeed and the server stays up."""

from __future__ import annotations

import asyncio
import math

import grpc
import pytest

from reward_server import domain as d
from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server._proto.reward.v1 import reward_pb2_grpc as pb_grpc
from reward_server.backends.fake import FakeJudge
from reward_server.client import RewardCallError
from reward_server.rpc.status import MAX_DETAILS_CHARS

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
                        "nli_constraints.preference: 2001 bytes exceed"),
    "no baseline for PARL-A": ([d.ScoreItem("x", parl(baselines=()))], "parl_reward.baselines"),
    "no rules": ([d.ScoreItem("x", d.RubricScoreSpec("c", "t", ()))], "rubric_score.rules"),
    "weights sum to zero": (
        [d.ScoreItem("x", d.WeightedSpec((d.WeightedPart(0.0, nli()),)))], "weights sum to 0"),
    "NaN weight": ([d.ScoreItem("x", d.WeightedSpec((d.WeightedPart(float("nan"), nli()),)))],
                   "parts[0].weight: nan"),
    "inf weight": ([d.ScoreItem("x", d.WeightedSpec((d.WeightedPart(float("inf"), nli()),)))],
                   "parts[0].weight: inf"),
    "duplicate ids": ([GOOD, GOOD], "items[1].id: duplicate id 'ok'"),
    "id over 256 bytes": ([d.ScoreItem("u" * 20_000, GOOD.spec)],
                          "items[0].id: 20000 bytes exceed service.limits.max_id_bytes=256"),
    "reserved id form": ([d.ScoreItem("#1", GOOD.spec), d.ScoreItem("", GOOD.spec)],
                         "items[0].id: '#1' has the form '#<index>'"),
    "too many rules": ([d.ScoreItem("x", d.RubricScoreSpec("c", "t", ("r",) * 65))],
                       "rules: 65 entries exceed service.limits.max_rules_per_item=64"),
    "too many parts": ([d.ScoreItem("x", d.WeightedSpec((d.WeightedPart(1.0, nli()),) * 9))],
                       "weighted.parts: 9 entries exceed service.limits.max_weighted_parts=8"),
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
    assert len(err.details) <= MAX_DETAILS_CHARS  # quoted values are excerpts


@pytest.mark.parametrize(("method", "body", "needle"), [
    ("Score", b"\xff\xff\xff", "not a valid reward.v1.ScoreRequest"),
    ("Score", b"\x0a\x02\x0a\x7f", "not a valid reward.v1.ScoreItem at items[0]"),  # item cut short
    ("Score", b"\x0b", "wire type 3"),
    ("Verify", b"\x0a\x10abc", "not a valid reward.v1.VerifyRequest"),
    ("InduceRubrics", b"\xff", "not a valid reward.v1.InduceRubricsRequest"),
    ("Info", b"\x0a", "not a valid reward.v1.InfoRequest"),
    ("Verify", b"\x0a\x00" * 4000, "more than any valid reward.v1.Verify request"),
])
async def test_malformed_bodies_are_invalid_argument(fake_server, method: str, body: bytes,
                                                     needle: str) -> None:
    async with grpc.aio.insecure_channel(fake_server.target) as ch:
        call = ch.unary_unary(f"/reward.v1.RewardService/{method}")  # raw bytes
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await call(body, timeout=5)
    assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT, e.value
    assert needle in (e.value.details() or ""), e.value.details()


async def test_an_item_over_the_wire_size_cap_is_refused_before_parsing() -> None:
    big = d.ScoreItem("big", d.NliConstraintsSpec(response="r " * 1000, answer="a", preference="p"))
    async with running_server(["service.limits.max_item_bytes=1024"]) as r:
        err = await _with_concurrent_good_call(r, lambda c: c.score([GOOD, big]))
    assert isinstance(err, RewardCallError) and err.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "items[1]: " in err.details and "service.limits.max_item_bytes=1024" in err.details


async def test_extreme_finite_weights_are_scored_not_internal(fake_server) -> None:
    parts = tuple(d.WeightedPart(w, nli(response="Paris is big.", answer="Paris", preference="big"))
                  for w in (1e308, 1e308, 5e-324))
    async with fake_server.client(max_retries=0) as c:
        [r] = await c.score([d.ScoreItem("w", d.WeightedSpec(parts))])
    assert r.status is d.ItemStatus.OK and r.reward is not None and math.isfinite(r.reward)


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


def _long_item(item_id: str, nbytes: int) -> d.ScoreItem:
    return d.ScoreItem(item_id, d.NliConstraintsSpec(response="r" * nbytes, answer="a", preference="p"))


async def test_a_request_over_the_servers_message_cap_fails_at_once_naming_the_setting() -> None:
    """gRPC refuses it RESOURCE_EXHAUSTED, the status of overload; the client must not resend
    the same bytes until its deadline but say what is wrong, after one attempt."""
    caps = ["server.max_message_bytes=100000", "service.limits.max_text_bytes=1000000",
            "service.limits.max_item_bytes=1000000"]
    async with running_server(caps) as r, r.client(timeout_s=30) as c:
        with pytest.raises(RewardCallError) as e:
            await c.score([_long_item("x", 200_000)])
        assert await c.score([_long_item("y", 60_000)])  # under the cap: served
    assert e.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED and e.value.attempts == 1
    assert "over the server's message cap of 100,000 (server.max_message_bytes)" in e.value.details


async def test_merged_calls_over_the_message_cap_are_resent_caller_by_caller() -> None:
    """Two callers' items fit one by one but not merged: each gets its own result."""
    from reward_server.client import CoalesceSettings

    caps = ["server.max_message_bytes=100000", "service.limits.max_text_bytes=1000000",
            "service.limits.max_item_bytes=1000000"]
    async with running_server(caps) as r, r.client(
            timeout_s=30, coalesce=CoalesceSettings(window_s=0.05)) as c:
        a, b = await asyncio.gather(c.score([_long_item("a", 60_000)]),
                                    c.score([_long_item("b", 60_000)]))
        assert c._coalescer is not None and c._coalescer.calls_sent == 3  # 1 merged, 2 alone
    assert [x.item_id for x in a] == ["a"] and [x.item_id for x in b] == ["b"]
    assert a[0].status is b[0].status is d.ItemStatus.OK
