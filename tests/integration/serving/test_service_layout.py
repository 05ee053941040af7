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
        f"serving.ray.transport={transport}", "service.admission.adaptive=false",
        "service.admission.max_calls_in_flight=1", "service.admission.min_calls_in_flight=1"]),
        judge_factory=slow)
    assert app.service is None
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
            serve.delete(app.engines.app_name)  # type: ignore[union-attr]
            assert await kit.answers(c.health, "NOT_SERVING", timeout_s=15)
            with pytest.raises(RewardCallError) as gone:
                await c.score(nli)
            assert gone.value.code is grpc.StatusCode.UNAVAILABLE
    finally:
        await app.stop(grace=1.0, drain_delay=0)
