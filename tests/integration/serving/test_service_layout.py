"""``serving.ray.layout: service`` on the session's local Ray: replicas that run the whole
service, an ingress that forwards each call's bytes to one of them."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from reward_server import domain as d
from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server._proto.reward.v1 import reward_pb2_grpc as pb_grpc
from reward_server.app import start_app
from reward_server.backends.fake import FakeJudge
from reward_server.client import AsyncRewardClient, RewardCallError
from reward_server.config import load_config
from reward_server.rpc.status import RETRY_PUSHBACK_KEY

pytestmark = pytest.mark.slow

FAKE = "engines={judge: {kind: fake}, nli: {kind: fake}}"


def _config(prefix: str, overrides: list[str]) -> Any:
    return load_config(overrides=[
        FAKE, "serving.mode=ray", "serving.ray.layout=service", f"serving.ray.app_prefix={prefix}",
        "serving.ray.service.num_cpus=0", "serving.ray.service.health_check_period_s=2",
        "serving.ray.service.graceful_shutdown_wait_loop_s=0.1",  # stops: not Serve's 2 s
        "serving.ray.ready_timeout_s=120", "server.port=0", "server.drain_delay_s=0",
        "server.health_poll_s=0.1", *overrides], env={})


@pytest.mark.parametrize("transport", ["grpc", "actor"])
async def test_calls_errors_and_health_through_the_service_replicas(
    ray_session: Any, kit: Any, transport: str
) -> None:
    """Answers, the replica's errors with their codes and its retry pushback (a Ray actor
    call wraps the error in RayTaskError, Serve's gRPC path does not), health."""
    from ray import serve

    def slow(settings: Any) -> FakeJudge:  # nested: pickled by value to the replica
        return FakeJudge(latency_s=0.3)

    app = await start_app(_config(f"t-svc-{transport}", [
        f"serving.ray.transport={transport}", "service.admission.max_waiting=0",
        "service.admission.max_calls_in_flight=1", "service.admission.min_calls_in_flight=1"]),
        judge_factory=slow)
    from reward_server.serving._private.service_host import ServiceHost

    assert isinstance(app.hosting, ServiceHost)  # the service runs in the replicas
    rubric = pb.ScoreRequest(items=[pb.ScoreItem(id="a", rubric_score=pb.RubricScore(
        context="c", text="coffee", rules=['It says "coffee".']))])
    try:
        async with AsyncRewardClient(app.target, max_retries=0) as c:
            assert await c.health() == "SERVING"
            nli = [d.ScoreItem(f"n{k}", d.NliConstraintsSpec("Paris is big.", "Paris", "big"))
                   for k in range(4)]
            results = await c.score(nli)
            assert [r.item_id for r in results] == ["n0", "n1", "n2", "n3"]
            assert all(r.status is d.ItemStatus.OK for r in results)
            assert (await c.info()).judge_model == "fake-judge"
            # 6 MB: past the replicas' 4 MiB gRPC limit, resent as an actor call
            big = [d.ScoreItem(f"b{k}", d.NliConstraintsSpec("word " * 1200, "Paris", "big"))
                   for k in range(1000)]
            assert all(r.status is d.ItemStatus.OK for r in await c.score(big))
            with pytest.raises(RewardCallError) as bad:
                await c.score([d.ScoreItem("b", d.NliConstraintsSpec("r", "x" * 40_000, "p"))])
            assert bad.value.code is grpc.StatusCode.INVALID_ARGUMENT
            assert "items[0] (id 'b')" in bad.value.details
        async with grpc.aio.insecure_channel(app.target) as ch:  # the replica's admission
            stub = pb_grpc.RewardServiceStub(ch)
            done = await asyncio.gather(*(stub.Score(rubric) for _ in range(3)),
                                        return_exceptions=True)
            refused = [e for e in done if isinstance(e, grpc.aio.AioRpcError)]
            assert 1 <= len(refused) <= 2, done
            for e in refused:
                assert e.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, e
                assert int(dict(e.trailing_metadata() or ())[RETRY_PUSHBACK_KEY]) >= 25
        if transport == "grpc":  # a second ingress attaches to the same replicas
            second = await start_app(_config(f"t-svc-{transport}", ["serving.ray.deploy=false"]))
            try:
                async with AsyncRewardClient(second.target, max_retries=0) as c:
                    assert (await c.score(nli[:1]))[0].status is d.ItemStatus.OK
            finally:
                await second.stop(grace=1.0, drain_delay=0)
        async with AsyncRewardClient(app.target, max_retries=0) as c:
            assert await c.health() == "SERVING"  # the second ingress left the application
            serve.delete(app.hosting.app_name)  # type: ignore[attr-defined]
            assert await kit.answers(c.health, "NOT_SERVING", timeout_s=15)
            with pytest.raises(RewardCallError) as gone:
                await c.score(nli)
            assert gone.value.code is grpc.StatusCode.UNAVAILABLE
    finally:
        await app.stop(grace=1.0, drain_delay=0)


async def test_a_replica_killed_under_load_loses_or_mixes_no_call(ray_session: Any) -> None:
    """Two service replicas, one killed while calls are in flight on both: every call is
    answered with its own items. The ingress resends the lost replica's calls once; the
    client's retries wait out the replicas' admission refusals (300 calls at once)."""
    from reward_server import metrics as m
    from reward_server.backends.fake import FakeNLI

    def resent() -> float:
        return m.ENGINE_CALLS.labels("service", "call", "retried")._value.get()  # type: ignore[no-any-return]

    def slow(settings: Any) -> FakeNLI:  # nested: pickled by value to the replicas
        return FakeNLI(latency_s=0.02)

    app = await start_app(_config("t-svc-kill", ["serving.ray.service.min_replicas=2",
                                                 "serving.ray.service.max_replicas=2"]),
                          nli_factory=slow)
    app_name = app.hosting.app_name  # type: ignore[attr-defined]
    replicas = [a["name"] for a in ray_session.util.list_named_actors(all_namespaces=True)
                if a["name"].startswith(f"SERVE_REPLICA::{app_name}#")]
    assert len(replicas) == 2, replicas
    before = resent()
    try:
        async with AsyncRewardClient(app.target) as c:
            async def one(k: int) -> list[str] | Exception:
                items = [d.ScoreItem(f"{k}-{j}", d.NliConstraintsSpec(f"Paris {k} is big.",
                                                                      "Paris", "big"))
                         for j in range(4)]
                try:
                    return [r.item_id for r in await c.score(items)
                            if r.status is d.ItemStatus.OK]
                except RewardCallError as e:
                    return e

            load = [asyncio.ensure_future(one(k)) for k in range(300)]
            while sum(f.done() for f in load) < 30:
                await asyncio.sleep(0.01)
            assert sum(f.done() for f in load) < 250
            ray_session.kill(ray_session.get_actor(replicas[0], namespace="serve"),
                             no_restart=True)
            results = await asyncio.gather(*load)
    finally:
        await app.stop(grace=1.0, drain_delay=0)
    assert [r for r in results if not isinstance(r, list)] == []  # nothing lost
    assert results == [[f"{k}-{j}" for j in range(4)] for k in range(300)]  # nor mixed
    assert resent() > before  # calls in flight on the killed replica were resent
