"""Admission at a real server: a call that does not fit waits in line while its deadline allows,
retried calls (gRPC's retries, or our client's ``reward-previous-attempts``) ahead of first
attempts; it is refused at once when the line's predicted wait would pass its deadline; a
trainer's closed loop that the engines keep up with is never refused; Info holds a call slot."""

from __future__ import annotations

import asyncio
import collections
import json
import time

import grpc
import pytest

from reward_server import domain as d
from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server.api import convert
from reward_server.backends.fake import FakeJudge, FakeNLI

from .conftest import running_server

SCORE = "/reward.v1.RewardService/Score"
INFO = "/reward.v1.RewardService/Info"
RULES = tuple(f'The text mentions "word{k}".' for k in range(16))
REQUEST = pb.ScoreRequest(items=[convert.item_to_proto(
    d.ScoreItem("a", d.RubricScoreSpec("ctx", "word1 text", RULES)))]).SerializeToString()
FIXED = ["service.admission.max_judgments_in_flight=16"]  # one call of 16 judgments at a time
ONE = pb.ScoreRequest(items=[convert.item_to_proto(
    d.ScoreItem("n", d.NliConstraintsSpec("Paris is big.", "Paris", "big")))]).SerializeToString()


async def _call(ch: grpc.aio.Channel, *, attempts: int | None = None, timeout: float = 10,
                request: bytes = REQUEST) -> tuple[float, str]:
    metadata = () if attempts is None else (("reward-previous-attempts", str(attempts)),)
    t = time.perf_counter()
    try:
        await ch.unary_unary(SCORE)(request, timeout=timeout, metadata=metadata)
        return time.perf_counter() - t, "OK"
    except grpc.aio.AioRpcError as e:
        return time.perf_counter() - t, e.code().name


async def test_a_call_that_does_not_fit_waits_in_line_retried_calls_first() -> None:
    async with running_server(FIXED, judge=FakeJudge(latency_s=0.3)) as r:
        async with grpc.aio.insecure_channel(r.target) as ch:
            await _call(ch)  # the usual call: 16 judgments, the whole limit
            busy = asyncio.create_task(_call(ch))
            await asyncio.sleep(0.1)
            first = asyncio.create_task(_call(ch))
            await asyncio.sleep(0.05)
            retried = asyncio.create_task(_call(ch, attempts=2))
            await asyncio.sleep(0.05)
            assert r.service.admission.waiting == 2, "both calls should wait in line"
            assert (await busy)[1] == "OK"
            (took_retried, code_retried), (took_first, code_first) = await retried, await first
    assert code_retried == code_first == "OK"  # nobody refused: they waited
    assert took_retried < took_first - 0.05 - 0.2  # the retried call ran first


async def test_a_call_is_refused_at_once_when_the_lines_wait_would_pass_its_deadline() -> None:
    """Calls of 0.3 s, one at a time: with one in flight and two waiting, a call with 0.2 s
    left cannot be served in time and is refused at once (RESOURCE_EXHAUSTED with a retry
    hint), not left to time out; one with 10 s left waits and is served."""
    async with running_server(FIXED, judge=FakeJudge(latency_s=0.3)) as r:
        async with grpc.aio.insecure_channel(r.target) as ch:
            for _ in range(3):  # the throughput and a call's time once admitted, measured
                await _call(ch)
            busy = [asyncio.create_task(_call(ch)) for _ in range(3)]
            await asyncio.sleep(0.1)
            hurried = await _call(ch, timeout=0.2)
            patient = await _call(ch, timeout=10)
            await asyncio.gather(*busy)
    assert hurried[1] == "RESOURCE_EXHAUSTED" and hurried[0] < 0.15, hurried
    assert patient[1] == "OK"


async def test_a_closed_loop_the_engines_keep_up_with_is_never_refused() -> None:
    """A trainer's per-sample pattern at the DEFAULT admission: 256 closed loops of 1-item
    calls on one channel for 2 s (engines that batch and keep up): every call answered OK."""
    async with running_server([], judge=FakeJudge(latency_s=0.01), nli=FakeNLI(latency_s=0.01)) as r:
        async with grpc.aio.insecure_channel(r.target) as ch:
            codes: collections.Counter[str] = collections.Counter()
            end = time.monotonic() + 2.0

            async def loop() -> None:
                while time.monotonic() < end:
                    codes[(await _call(ch, request=ONE, timeout=30))[1]] += 1

            await asyncio.gather(*(loop() for _ in range(256)))
        refused = r.service.admission.refused
    assert set(codes) == {"OK"} and codes["OK"] > 256, codes
    assert refused == 0


async def test_grpcs_own_retries_count_as_attempts() -> None:
    """A channel with gRPC's retry policy sends grpc-previous-rpc-attempts on each retry. With
    the line full (one place), its first attempt is refused; its retry takes the place of the
    waiting first attempt of another client, which is refused instead."""
    cfg = {"methodConfig": [{"name": [{"service": "reward.v1.RewardService"}], "retryPolicy": {
        "maxAttempts": 5, "initialBackoff": "0.01s", "maxBackoff": "0.05s",
        "backoffMultiplier": 2, "retryableStatusCodes": ["RESOURCE_EXHAUSTED"]}}]}
    async with running_server([*FIXED, "service.admission.max_waiting=1"],
                              judge=FakeJudge(latency_s=1.0)) as r:  # longer than a pushback
        async with grpc.aio.insecure_channel(r.target) as plain, grpc.aio.insecure_channel(
                r.target, options=[("grpc.service_config", json.dumps(cfg)),
                                   ("grpc.enable_retries", 1)]) as retrying:
            await _call(plain)
            busy = asyncio.create_task(_call(plain))
            await asyncio.sleep(0.1)
            waiting = asyncio.create_task(_call(plain))
            await asyncio.sleep(0.05)
            _took, code = await _call(retrying)
            assert (await busy)[1] == "OK"
            assert (await waiting)[1] == "RESOURCE_EXHAUSTED"
    assert code == "OK", code


@pytest.mark.parametrize("line", [True, False])
async def test_info_holds_a_call_slot(line: bool) -> None:
    """One call slot: Info waits in line for it, or without a line is refused naming it."""
    overrides = ["service.admission.max_calls_in_flight=1"]
    async with running_server(overrides + ([] if line else ["service.admission.max_waiting=0"]),
                              judge=FakeJudge(latency_s=0.3)) as r:
        async with grpc.aio.insecure_channel(r.target) as ch:
            busy = asyncio.create_task(_call(ch))
            await asyncio.sleep(0.1)
            t = time.perf_counter()
            try:
                await ch.unary_unary(INFO)(pb.InfoRequest().SerializeToString(), timeout=5)
                code, details = "OK", ""
            except grpc.aio.AioRpcError as e:
                code, details = e.code().name, e.details() or ""
            took = time.perf_counter() - t
            assert (await busy)[1] == "OK"
            assert (await ch.unary_unary(INFO)(pb.InfoRequest().SerializeToString(), timeout=5))
    if line:
        assert code == "OK" and took > 0.1  # it waited for the slot
    else:
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


async def test_the_health_port_answers_and_tells_the_truth_when_the_main_port_is_full() -> None:
    """Connections that only send the HTTP/2 preface take every slot of the main port
    (server.max_connections=4, no per-peer share): health on server.health_port (on by
    default) still answers, NOT_SERVING while new connections are refused, and SERVING again
    once they are gone."""
    from bench._h2 import RawH2

    overrides = ["server.max_connections=4", "server.max_connections_per_peer=null",
                 "server.connection_check_s=0.1"]
    async with running_server(overrides) as r:  # health_port: auto
        grpc_server = r.app.server
        assert grpc_server.health_port
        idle = [await RawH2.open(r.port) for _ in range(8)]
        try:
            for _ in range(50):  # the guard looks every 0.1 s
                own = await _health(grpc_server.health_port)
                if own == "NOT_SERVING":
                    break
                await asyncio.sleep(0.1)
            main = await _health(r.port)
        finally:
            for c in idle:
                await c.close()
        for _ in range(50):
            back = await _health(grpc_server.health_port)
            if back == "SERVING":
                break
            await asyncio.sleep(0.1)
    assert own == "NOT_SERVING"
    assert main != "SERVING", "the main port was expected to be full (else this test shows nothing)"
    assert back == "SERVING"


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
