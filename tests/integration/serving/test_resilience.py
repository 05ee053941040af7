"""Replica death mid-load, overload beyond the queue bound, autoscaling up and back down."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from reward_server import metrics as m
from reward_server.backends.base import GenerationRequest
from reward_server.domain import Task
from reward_server.errors import BackendUnavailable, Overloaded
from reward_server.rubric.templates import judge_prompt
from reward_server.serving import RayEngines

pytestmark = pytest.mark.slow


def _retried() -> float:
    return m.ENGINE_CALLS.labels("judge", "generate", "retried")._value.get()  # type: ignore[no-any-return]


async def _wait_for(pred: Any, timeout_s: float, every_s: float = 0.25) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        await asyncio.sleep(every_s)
    return bool(pred())


# ------------------------------------------------------------------ replica killed mid-load
@pytest.fixture(scope="module")
def two_replicas(ray_session: Any, kit: Any) -> Iterator[RayEngines]:
    config = kit.config(
        "t-kill",
        [
            "engines.nli.kind=judge",  # no NLI deployment: not needed here
            "serving.ray.judge.min_replicas=2",
            "serving.ray.judge.max_replicas=2",
            "engines.judge.batching.max_items=16",
        ],
    )
    eng = kit.start(config, judge_factory=kit.judge_factory(latency_s=0.1, n_scripted=400))
    yield eng
    eng.shutdown()


async def test_killing_a_replica_mid_load_loses_or_mixes_no_item(
    two_replicas: RayEngines, ray_session: Any
) -> None:
    judge = two_replicas.judge
    retried_before = _retried()

    async def one(i: int) -> str | Exception:
        try:
            (out,) = await judge.generate([GenerationRequest(system="", user="u", seed=i)])
            return out
        except BackendUnavailable as e:
            return e

    stats = await two_replicas.batch_stats("judge")  # while idle: every replica answers
    assert len(stats) == 2
    victim = next(iter(stats.values()))["actor_name"]
    # 400 one-item calls: the handles carry ~25 a second here, so the kill lands with ~350 in
    # flight or queued, on both replicas (1,000 took 40 s for the same assertions)
    n = 400
    load = [asyncio.ensure_future(one(i)) for i in range(n)]
    # once a tenth are done both replicas are busy (Serve routes to the shorter of two queues)
    assert await _wait_for(lambda: sum(f.done() for f in load) >= n // 10, 60, every_s=0.05)
    assert sum(f.done() for f in load) < n * 8 // 10
    ray_session.kill(ray_session.get_actor(victim, namespace="serve"), no_restart=True)
    results = await asyncio.gather(*load)

    assert len(results) == n
    for i, r in enumerate(results):  # each item: its own answer, or an explicit failure
        assert r == f"out-{i}" or isinstance(r, BackendUnavailable), (i, r)
    assert _retried() > retried_before  # calls in flight on the victim were resent
    # one retry on the surviving replica is enough: nothing was lost
    assert sum(isinstance(r, BackendUnavailable) for r in results) == 0
    # Serve replaces the dead replica
    assert await _wait_for(lambda: two_replicas.replica_counts("judge").get("RUNNING") == 2, 60)


# ------------------------------------------------------------------ overload
@pytest.fixture(scope="module")
def tiny(ray_session: Any, kit: Any) -> Iterator[RayEngines]:
    config = kit.config(
        "t-load",
        [
            "engines.nli.kind=judge",
            "engines.judge.batching.wait_ms=0",
            "serving.ray.judge.max_ongoing_requests=2",
            "serving.ray.judge.max_queued_requests=2",
            "engines.judge.batching.max_items=1",
        ],
    )
    eng = kit.start(config, judge_factory=kit.judge_factory(latency_s=1.0, n_scripted=50))
    yield eng
    eng.shutdown()


async def test_overload_beyond_the_queue_bound_fails_fast_and_stays_healthy(
    tiny: RayEngines,
) -> None:
    judge = tiny.judge

    async def one(i: int) -> tuple[float, str | Exception]:
        start = time.monotonic()
        try:
            (out,) = await judge.generate([GenerationRequest(system="", user="u", seed=i)])
            return time.monotonic() - start, out
        except Overloaded as e:
            return time.monotonic() - start, e

    results = await asyncio.gather(*(one(i) for i in range(20)))
    refused = [(t, r) for t, r in results if isinstance(r, Overloaded)]
    served = [(i, t, r) for i, (t, r) in enumerate(results) if not isinstance(r, Exception)]
    # 2 running on the replica + 2 queued at the handle; Serve's count of queued calls is
    # approximate under a simultaneous burst (a call counts as queued until a replica accepts
    # it, and calls sent to a full replica go back to the queue: 6 seen once in CI), so the
    # bound asserted is "a few of the 20", not Serve's exact accounting. The others are
    # refused at once.
    assert 2 <= len(served) <= 8
    assert len(refused) == 20 - len(served)
    assert all(t < 0.5 for t, _ in refused)
    assert all(r == f"out-{i}" and t >= 1.0 for i, t, r in served)
    # still healthy and serving
    assert tiny.replica_counts("judge") == {"RUNNING": 1}
    assert await judge.generate([GenerationRequest(system="", user="u", seed=7)]) == ["out-7"]


# ------------------------------------------------------------------ autoscaling
@pytest.fixture(scope="module")
def autoscaled(ray_session: Any, kit: Any) -> Iterator[RayEngines]:
    config = kit.config(
        "t-scale",
        [
            "engines.nli.kind=judge",
            "serving.ray.judge.min_replicas=1",
            "serving.ray.judge.max_replicas=3",
            "serving.ray.judge.target_ongoing_requests=2",
            "engines.judge.batching.max_items=1",
        ],
    )
    eng = kit.start(config, judge_factory=kit.judge_factory(latency_s=0.2))
    yield eng
    eng.shutdown()


async def test_replicas_scale_up_under_load_within_bounds_and_back_down(
    autoscaled: RayEngines,
) -> None:
    prompt = judge_prompt("", "x", '"x"', Task.GENERIC)
    assert autoscaled.replica_counts("judge") == {"RUNNING": 1}
    stop = asyncio.Event()
    peak = 1

    async def worker() -> None:
        while not stop.is_set():
            assert await autoscaled.judge.p_yes([prompt]) == [pytest.approx(0.98)]

    workers = [asyncio.ensure_future(worker()) for _ in range(12)]
    try:
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            counts = autoscaled.replica_counts("judge")
            total = sum(counts.values())
            assert total <= 3  # never above max_replicas
            peak = max(peak, counts.get("RUNNING", 0))
            if peak >= 2:
                break
            await asyncio.sleep(0.5)
    finally:
        stop.set()
        await asyncio.gather(*workers)
    assert peak >= 2, "12 callers at target 2 per replica should add replicas"
    # load gone: back to min_replicas after downscale_delay_s (2 s) and draining
    assert await _wait_for(lambda: autoscaled.replica_counts("judge") == {"RUNNING": 1}, 60)


# ------------------------------------------------------------------ errors and live health
async def test_a_replica_bug_is_internal_once_and_losing_every_replica_turns_health(
    ray_session: Any, kit: Any
) -> None:
    import grpc
    from ray import serve

    from reward_server import domain as d
    from reward_server.app import start_app
    from reward_server.backends.fake import FakeJudge
    from reward_server.client import AsyncRewardClient, RewardCallError

    config = kit.config("t-bug", ["engines.nli.kind=judge", "server.port=0",
                                  "server.health_poll_s=0.1", "server.drain_delay_s=0"])

    def buggy(settings: Any) -> FakeJudge:  # nested: pickled by value to the replica
        judge = FakeJudge()
        judge.fail_with = IndexError("list index out of range")
        return judge

    app = await start_app(config, judge_factory=buggy)
    item = d.ScoreItem("a", d.RubricScoreSpec("c", "coffee", ('It says "coffee".',)))
    try:
        async with AsyncRewardClient(app.target, max_retries=3, backoff_base_s=0.1) as c:
            assert await c.health() == "SERVING"
            with pytest.raises(RewardCallError) as e:
                await c.score([item])
            assert e.value.code is grpc.StatusCode.INTERNAL and e.value.attempts == 1
            assert "IndexError" in e.value.details
            assert await c.health() == "SERVING"  # a bug is not an outage
            serve.delete(app.hosting.engines.app_name("judge"))  # every judge replica is gone
            assert await kit.answers(c.health, "NOT_SERVING", timeout_s=10)
    finally:
        await app.stop(grace=1.0, drain_delay=0)

