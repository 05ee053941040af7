"""More calls on one channel than server.max_concurrent_streams: gRPC queues them at the client
(HTTP/2 concurrency), none is refused with REFUSED_STREAM (UNAVAILABLE). This is a trainer's
reward worker with many rollouts in flight on one channel (verl sends one call per sample)."""

from __future__ import annotations

import asyncio
import collections

import grpc

from reward_server import domain as d
from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server.api import convert

from .conftest import running_server

SCORE = "/reward.v1.RewardService/Score"
ITEM = d.ScoreItem("a", d.NliConstraintsSpec("Paris is big.", "Paris", "big"))


async def test_512_concurrent_calls_on_one_grpc_channel_all_answer_ok() -> None:
    raw = pb.ScoreRequest(items=[convert.item_to_proto(ITEM)]).SerializeToString()
    async with running_server(["server.max_concurrent_streams=128"]) as r:
        async with grpc.aio.insecure_channel(r.target) as ch:  # plain gRPC: no retries of ours
            call = ch.unary_unary(SCORE)

            async def one() -> str:
                try:
                    await call(raw, timeout=120)
                    return "OK"
                except grpc.aio.AioRpcError as e:
                    return f"{e.code().name}: {e.details()}"

            codes = collections.Counter(await asyncio.gather(*(one() for _ in range(512))))
    assert codes == {"OK": 512}, codes


async def test_the_client_loses_no_call_at_512_concurrent_one_item_calls() -> None:
    """verl's per-sample pattern on AsyncRewardClient, with no retry of ours to hide anything."""
    async with running_server() as r, r.client(max_retries=0, timeout_s=120) as c:
        results = await asyncio.gather(*(c.score([ITEM]) for _ in range(512)),
                                       return_exceptions=True)
    failed = [repr(x) for x in results if isinstance(x, BaseException)]
    assert not failed, failed[:3]
    assert all(res[0].status is d.ItemStatus.OK for res in results if isinstance(res, list))
