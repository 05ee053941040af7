"""``serving.ray.layout: service`` without Ray: the forwarding ingress (rpc/forwarding.py)
in front of a :class:`ServiceReplica` built in this process, joined by a Forward that pickles
the call and its error as Ray does. What crosses the hop: the answer's bytes, each error's
status and message, the retry pushback, the deadline and the client's previous attempts."""

from __future__ import annotations

import asyncio
import json
import pickle
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from reward_server import domain as d
from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server._proto.reward.v1 import reward_pb2_grpc as pb_grpc
from reward_server.backends.fake import FakeJudge, FakeNLI
from reward_server.client import AsyncRewardClient, RewardCallError
from reward_server.config import load_config
from reward_server.rpc.forwarding import ForwardBackend
from reward_server.rpc.server import RewardGrpcServer, create_server
from reward_server.rpc.status import RETRY_PUSHBACK_KEY
from reward_server.service import Admission
from reward_server.service_deployment import ServiceReplica, replica_config

FAKE = "engines={judge: {kind: fake}, nli: {kind: fake}}"
GRPC_TIMEOUT_UNIT_S = 0.01  # of a grpc-timeout header between 1 s and 10 s
NLI_ITEM = d.ScoreItem("n", d.NliConstraintsSpec("Paris is big.", "Paris", "big"))


class Hop:
    """A Forward over one in-process replica, arguments and errors through pickle (as Ray
    moves them); records what each call carried."""

    def __init__(self, replica: ServiceReplica) -> None:
        self.replica = replica
        self.seen: list[tuple[str, float, int]] = []

    async def __call__(self, rpc: str, raw: bytes, *, timeout_s: float, attempts: int) -> bytes:
        self.seen.append((rpc, timeout_s, attempts))
        args = pickle.loads(pickle.dumps([(rpc, raw, timeout_s, attempts)]))
        try:
            (out,) = await self.replica.call(args)
        except Exception as exc:
            raise pickle.loads(pickle.dumps(exc)) from None
        return out


def _replica(overrides: list[str], **factories: Any) -> ServiceReplica:
    config = load_config(overrides=[FAKE, *overrides], env={})
    return ServiceReplica(replica_config(config), **factories)


async def _ingress(hop: Hop, overrides: list[str] = ()) -> tuple[RewardGrpcServer, str]:
    config = load_config(overrides=["server.port=0", "server.drain_delay_s=0", *overrides], env={})
    backend = ForwardBackend(hop, config.server,
                             admission=Admission(max_judgments=None, max_bytes=1 << 20))
    server, port = create_server(config.server, backend)
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
async def pair() -> AsyncIterator[tuple[Hop, str]]:
    hop = Hop(_replica([]))
    server, target = await _ingress(hop)
    yield hop, target
    await server.stop(0, drain_delay=0)


async def test_a_call_is_answered_with_the_replicas_bytes(pair: tuple[Hop, str]) -> None:
    hop, target = pair
    items = [d.ScoreItem(f"i{k}", NLI_ITEM.spec) for k in range(3)]
    async with AsyncRewardClient(target) as c:
        results = await c.score(items)
        info = await c.info()
    assert [r.item_id for r in results] == ["i0", "i1", "i2"]
    assert all(r.status is d.ItemStatus.OK and r.reward == 1.0 for r in results)
    assert results[0].components["s_correct"] == pytest.approx(0.98)
    assert info.fake_engines and info.nli_model == "fake-nli"
    assert info.settings["serving.ray.layout"] == "service"  # the ingress says so
    assert info.settings["service.admission.scope"] == "per replica"
    assert info.settings["service.admission.enabled"] == "true"  # the replica's own
    assert [rpc for rpc, _, _ in hop.seen] == ["Score", "Info"]


async def test_the_replicas_errors_keep_their_status_and_message(pair: tuple[Hop, str]) -> None:
    _, target = pair
    bad = d.ScoreItem("bad", d.NliConstraintsSpec("r", "x" * 40_000, "p"))
    async with AsyncRewardClient(target, max_retries=0) as c:
        with pytest.raises(RewardCallError) as e:
            await c.score([bad])
    assert e.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "items[0] (id 'bad').nli_constraints.answer" in e.value.details
    async with grpc.aio.insecure_channel(target) as ch:  # a body that is not a ScoreRequest
        with pytest.raises(grpc.aio.AioRpcError) as raw:
            await ch.unary_unary("/reward.v1.RewardService/Score")(b"\xff\xff\xff")
    assert raw.value.code() is grpc.StatusCode.INVALID_ARGUMENT


async def test_an_engine_failure_is_unavailable_and_a_bug_internal_across_the_hop() -> None:
    judge = FakeJudge()
    hop = Hop(_replica([], judge_factory=lambda s: judge, nli_factory=lambda s: FakeNLI()))
    server, target = await _ingress(hop)
    item = d.ScoreItem("a", d.RubricScoreSpec("c", "coffee", ('It says "coffee".',)))
    try:
        async with AsyncRewardClient(target, max_retries=0) as c:
            judge.fail_with = IndexError("list index out of range")
            with pytest.raises(RewardCallError) as bug:
                await c.score([item])
            judge.fail_with = ConnectionError("engine socket closed")
            with pytest.raises(RewardCallError) as down:
                await c.score([item])
            judge.fail_with = None
            assert (await c.score([item]))[0].status is d.ItemStatus.OK
    finally:
        await server.stop(0, drain_delay=0)
    assert bug.value.code is grpc.StatusCode.INTERNAL and "IndexError" in bug.value.details
    assert down.value.code is grpc.StatusCode.UNAVAILABLE


async def test_a_refusal_for_load_carries_the_replicas_pushback() -> None:
    hop = Hop(_replica(["service.admission.max_waiting=0", "service.admission.max_calls_in_flight=1",
                        "service.admission.min_calls_in_flight=1"],
                       judge_factory=lambda s: FakeJudge(latency_s=0.3),
                       nli_factory=lambda s: FakeNLI()))
    server, target = await _ingress(hop)
    request = pb.ScoreRequest(items=[pb.ScoreItem(id="a", rubric_score=pb.RubricScore(
        context="c", text="coffee", rules=['It says "coffee".']))])
    try:
        async with grpc.aio.insecure_channel(target) as ch:
            stub = pb_grpc.RewardServiceStub(ch)
            calls = [stub.Score(request, metadata=(("reward-previous-attempts", "0"),))
                     for _ in range(3)]
            done = await asyncio.gather(*calls, return_exceptions=True)
    finally:
        await server.stop(0, drain_delay=0)
    refused = [e for e in done if isinstance(e, grpc.aio.AioRpcError)]
    assert len(refused) == 2 and sum(isinstance(r, pb.ScoreResponse) for r in done) == 1
    for e in refused:
        assert e.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        pushback = dict(e.trailing_metadata() or ())[RETRY_PUSHBACK_KEY]
        assert int(pushback) >= 25  # the replica's hint (>= 50 ms, jittered by half)


async def test_the_deadline_and_the_previous_attempts_reach_the_replica(
    pair: tuple[Hop, str]
) -> None:
    hop, target = pair
    request = pb.ScoreRequest(items=[pb.ScoreItem(id="n", nli_constraints=pb.NliConstraints(
        response="Paris is big.", answer="Paris", preference="big"))])
    async with grpc.aio.insecure_channel(target) as ch:
        stub = pb_grpc.RewardServiceStub(ch)
        await stub.Score(request, timeout=7.0, metadata=(("reward-previous-attempts", "3"),))
        await stub.Score(request)
    (_, with_deadline, attempts), (_, default, none) = hop.seen
    # gRPC's own time left, read as the call is forwarded; gRPC's client rounds the timeout it
    # sends up to the unit of the grpc-timeout header (10 ms from 1 s to 10 s: a 7.0 s timeout
    # went out as "7010m" in 18 of 20 calls, grpcio 1.85.1), so that is the most gRPC tells
    assert 6.0 < with_deadline <= 7.0 + GRPC_TIMEOUT_UNIT_S and attempts == 3
    assert 299.0 < default <= 300.0 and none == 0  # server.default_timeout_s


async def test_the_http_door_answers_json_from_the_replicas_bytes() -> None:
    hop = Hop(_replica([]))
    config = load_config(overrides=["server.port=0", "server.drain_delay_s=0",
                                    "server.http.port=0"], env={})
    from reward_server.rpc.http import HttpDoor

    server, _ = create_server(config.server,
                              ForwardBackend(hop, config.server, admission=Admission.off()))
    door = HttpDoor(config.server, server.servicer, server.monitor)
    await server.start()
    await door.start()
    body = {"items": [{"id": "n", "nli_constraints": {
        "response": "Paris is big.", "answer": "Paris", "preference": "big"}}]}

    def post() -> dict[str, Any]:
        req = urllib.request.Request(f"http://127.0.0.1:{door.port}/v1/score",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            out: dict[str, Any] = json.loads(r.read())
            return out

    try:
        answer = await asyncio.to_thread(post)
    finally:
        await door.stop()
        await server.stop(0, drain_delay=0)
    assert answer["results"][0]["id"] == "n" and answer["results"][0]["reward"] == 1.0
