"""Admission at a real server: a retried call (gRPC's retries, or our client's
``reward-previous-attempts``) waits for room ahead of first attempts, which are refused at once;
Info holds a call slot."""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import pytest

from reward_server import domain as d
from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server.backends.fake import FakeJudge
from reward_server.rpc import convert

from .conftest import running_server

SCORE = "/reward.v1.RewardService/Score"
INFO = "/reward.v1.RewardService/Info"
RULES = tuple(f'The text mentions "word{k}".' for k in range(16))
REQUEST = pb.ScoreRequest(items=[convert.item_to_proto(
    d.ScoreItem("a", d.RubricScoreSpec("ctx", "word1 text", RULES)))]).SerializeToString()
FIXED = ["service.admission.adaptive=false", "service.admission.max_judgments_in_flight=16",
         "service.admission.max_wait_s=1.0"]


async def _call(ch: grpc.aio.Channel, *, attempts: int | None = None) -> tuple[float, str]:
    metadata = () if attempts is None else (("reward-previous-attempts", str(attempts)),)
    t = time.perf_counter()
    try:
        await ch.unary_unary(SCORE)(REQUEST, timeout=10, metadata=metadata)
        return time.perf_counter() - t, "OK"
    except grpc.aio.AioRpcError as e:
        return time.perf_counter() - t, e.code().name


async def test_a_retried_call_waits_for_room_and_a_first_attempt_is_refused_at_once() -> None:
    async with running_server(FIXED, judge=FakeJudge(latency_s=0.3)) as r:
        async with grpc.aio.insecure_channel(r.target) as ch:
            await _call(ch)  # the usual call: 16 judgments, the whole limit
            busy = asyncio.create_task(_call(ch))
            await asyncio.sleep(0.1)
            first = await _call(ch)
            retried = asyncio.create_task(_call(ch, attempts=2))
            await asyncio.sleep(0.05)
            assert r.service.admission.waiting, "the retried call should wait for room"
            newcomer = await _call(ch)  # room is not free yet, and a retried call waits
            assert (await busy)[1] == "OK"
            took, code = await retried
    assert first[1] == "RESOURCE_EXHAUSTED" and first[0] < 0.15
    assert newcomer[1] == "RESOURCE_EXHAUSTED" and newcomer[0] < 0.15
    assert code == "OK" and 0.3 < took < 1.0  # waited for the busy call, then ran


async def test_grpcs_own_retries_count_as_attempts() -> None:
    """A channel with gRPC's retry policy sends grpc-previous-rpc-attempts on each retry; the
    retried attempt waits for room instead of being refused again."""
    cfg = {"methodConfig": [{"name": [{"service": "reward.v1.RewardService"}], "retryPolicy": {
        "maxAttempts": 5, "initialBackoff": "0.01s", "maxBackoff": "0.05s",
        "backoffMultiplier": 2, "retryableStatusCodes": ["RESOURCE_EXHAUSTED"]}}]}
    async with running_server(FIXED, judge=FakeJudge(latency_s=0.3)) as r:
        async with grpc.aio.insecure_channel(r.target) as plain, grpc.aio.insecure_channel(
                r.target, options=[("grpc.service_config", json.dumps(cfg)),
                                   ("grpc.enable_retries", 1)]) as retrying:
            await _call(plain)
            busy = asyncio.create_task(_call(plain))
            await asyncio.sleep(0.1)
            _took, code = await _call(retrying)
            assert (await busy)[1] == "OK"
    assert code == "OK", code


async def test_info_holds_a_call_slot() -> None:
    async with running_server(["service.admission.adaptive=false",
                               "service.admission.max_calls_in_flight=1"],
                              judge=FakeJudge(latency_s=0.3)) as r:
        async with grpc.aio.insecure_channel(r.target) as ch:
            busy = asyncio.create_task(_call(ch))
            await asyncio.sleep(0.1)
            try:
                await ch.unary_unary(INFO)(pb.InfoRequest().SerializeToString(), timeout=5)
                code = "OK"
            except grpc.aio.AioRpcError as e:
                code, details = e.code().name, e.details() or ""
            assert (await busy)[1] == "OK"
            assert (await ch.unary_unary(INFO)(pb.InfoRequest().SerializeToString(), timeout=5))
    assert code == "RESOURCE_EXHAUSTED" and "service.admission.max_calls_in_flight=1" in details


async def _health(port: int) -> str:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        try:
            reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                               timeout=2)
        except grpc.aio.AioRpcError as e:
            return e.code().name
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


async def test_the_health_port_keeps_its_slots_when_the_main_port_is_full() -> None:
    """Connections that only send the HTTP/2 preface take every slot of the main port
    (server.max_connections=4); health on server.health_port (on by default: auto, a free
    port beside port 0) still answers."""
    from bench._h2 import RawH2

    async with running_server(["server.max_connections=4"]) as r:  # health_port: auto
        grpc_server = r.app.server
        assert grpc_server.health_port
        idle = [await RawH2.open(r.port) for _ in range(8)]
        try:
            await asyncio.sleep(0.2)
            main, own = await _health(r.port), await _health(grpc_server.health_port)
        finally:
            for c in idle:
                await c.close()
    assert own == "SERVING"
    assert main != "SERVING", "the main port was expected to be full (else this test shows nothing)"


async def test_an_explicit_health_port_that_is_taken_fails_the_start_and_auto_does_not() -> None:
    import socket

    from reward_server.errors import ConfigError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match="health port"):
            async with running_server([f"server.health_port={port}"]):
                pass
    async with running_server(["server.health_port=null"]) as r:
        assert r.app.server.health_port is None
