"""Drain, health transitions, and the client's bounded retry against a server failing on purpose."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc
import pytest

from reward_server import domain as d
from reward_server.backends.base import GenerationRequest, JudgePrompt
from reward_server.backends.fake import FakeJudge, FakeNLI
from reward_server.client import RewardCallError
from reward_server.errors import BackendUnavailable, Overloaded

from .conftest import running_server

ITEM = d.ScoreItem("a", d.RubricScoreSpec("c", "coffee time", ('The text mentions "coffee".',)))


class FailingJudge(FakeJudge):
    """A real judge engine that raises ``error`` on its first ``failures`` calls."""

    def __init__(self, failures: int, error: Exception) -> None:
        super().__init__()
        self.failures = failures
        self.error = error
        self.calls = 0

    async def p_yes(self, prompts: Sequence[JudgePrompt]) -> list[float]:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return await super().p_yes(prompts)

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[str]:
        return await super().generate(requests)


@pytest.mark.parametrize(
    ("error", "code"),
    [(BackendUnavailable("judge restarting"), grpc.StatusCode.UNAVAILABLE),
     (Overloaded("queue full"), grpc.StatusCode.RESOURCE_EXHAUSTED)],
)
async def test_client_retries_retryable_codes_within_budget(error, code) -> None:
    judge = FailingJudge(failures=2, error=error)
    async with running_server(judge=judge) as r:
        async with r.client(max_retries=3, backoff_base_s=0.1, seed=1) as c:
            assert (await c.score([ITEM]))[0].status is d.ItemStatus.OK
            assert judge.calls == 3  # gRPC's retryPolicy: 2 failed tries, then the answer
        judge.calls, judge.failures = 0, 100
        async with r.client(max_retries=2, backoff_base_s=0.1, timeout_s=2.0) as c:
            with pytest.raises(RewardCallError) as e:
                await c.score([ITEM])
        if code is grpc.StatusCode.UNAVAILABLE:
            assert e.value.code is code and error.args[0] in e.value.details  # the server's status
            assert judge.calls == 3  # budget honoured: 1 try + 2 retries
        else:  # overload is waited out until the deadline, however many attempts that takes
            assert e.value.code in (code, grpc.StatusCode.DEADLINE_EXCEEDED)
            assert judge.calls > 3


async def test_a_budget_above_grpcs_cap_of_5_attempts_runs_in_rounds() -> None:
    judge = FailingJudge(failures=7, error=BackendUnavailable("judge restarting"))
    async with running_server(judge=judge) as r:
        async with r.client(max_retries=7, backoff_base_s=0.1, backoff_cap_s=0.2, seed=1) as c:
            assert (await c.score([ITEM]))[0].status is d.ItemStatus.OK
        assert judge.calls == 8  # 5 gRPC attempts, then a second round: 3 more
        judge.calls, judge.failures = 0, 100
        async with r.client(max_retries=7, backoff_base_s=0.1, backoff_cap_s=0.2) as c:
            with pytest.raises(RewardCallError) as e:
                await c.score([ITEM])
        assert e.value.code is grpc.StatusCode.UNAVAILABLE and e.value.attempts == 2  # rounds
        assert judge.calls == 10  # the budget rounds up to whole rounds of 5: never unbounded


async def test_client_does_not_retry_other_codes() -> None:
    judge = FailingJudge(failures=100, error=RuntimeError("bug in engine"))
    async with running_server(judge=judge) as r, r.client(max_retries=5) as c:
        with pytest.raises(RewardCallError) as e:
            await c.score([ITEM])
        assert e.value.code is grpc.StatusCode.INTERNAL
        assert "RuntimeError" in e.value.details
        assert judge.calls == 1
        with pytest.raises(RewardCallError) as e:
            await c.score([])
        assert e.value.code is grpc.StatusCode.INVALID_ARGUMENT


async def test_drain_reports_not_serving_and_finishes_in_flight_calls() -> None:
    async with running_server(judge=FakeJudge(latency_s=0.8)) as r:
        async with r.client() as c, r.client() as probe:
            assert await probe.health() == "SERVING"
            in_flight = asyncio.create_task(c.score([ITEM]))
            await asyncio.sleep(0.2)
            drain = asyncio.create_task(r.app.server.stop(grace=5.0, drain_delay=0.4))
            await asyncio.sleep(0.1)
            assert await probe.health() == "NOT_SERVING"
            results = await in_flight
            assert results[0].status is d.ItemStatus.OK  # completed, not cut off
            await drain
            with pytest.raises(RewardCallError) as e:
                await probe.health(timeout_s=1.0)
            assert e.value.code is grpc.StatusCode.UNAVAILABLE


class CancellingJudge(FakeJudge):
    """A judge whose engine call gets cancelled from inside (as when a replica goes away)."""

    async def p_yes(self, prompts: Sequence[JudgePrompt]) -> list[float]:
        inner = asyncio.ensure_future(asyncio.sleep(10))
        asyncio.get_running_loop().call_later(0.05, inner.cancel)
        await inner
        return []


async def test_a_cancellation_leaking_from_an_engine_is_unavailable_not_cancelled() -> None:
    async with running_server(judge=CancellingJudge()) as r, r.client(max_retries=0) as c:
        with pytest.raises(RewardCallError) as e:
            await c.score([ITEM])
        assert e.value.code is grpc.StatusCode.UNAVAILABLE
        assert "cancelled" in e.value.details
        assert await c.health() == "SERVING"


@pytest.mark.parametrize(("error", "code", "attempts"), [
    (IndexError("list index out of range"), grpc.StatusCode.INTERNAL, 1),  # a bug: once
    (MemoryError(), grpc.StatusCode.UNAVAILABLE, 3),  # infrastructure: retried
])
async def test_an_engine_bug_is_internal_once_and_infrastructure_is_retried(error, code, attempts) -> None:
    judge = FailingJudge(failures=100, error=error)
    async with running_server(judge=judge) as r, r.client(max_retries=2, backoff_base_s=0.1) as c:
        with pytest.raises(RewardCallError) as e:
            await c.score([ITEM])
    assert e.value.code is code
    assert judge.calls == attempts  # gRPC's retryPolicy resent the infrastructure failure; no retry storm on a bug
    assert type(error).__name__ in e.value.details


async def _health_becomes(c, want: str, within_s: float) -> float:
    loop = asyncio.get_running_loop()
    start = loop.time()
    while (status := await c.health(timeout_s=1.0)) != want:
        assert loop.time() - start < within_s, f"health stayed {status}, wanted {want}"
        await asyncio.sleep(0.02)
    return loop.time() - start


async def test_health_follows_the_engines() -> None:
    judge = FakeJudge()
    async with running_server(["server.health_poll_s=0.05"], judge=judge) as r, \
            r.client(max_retries=0) as c:
        assert await c.health() == "SERVING"
        assert await c.health("reward.v1.RewardService") == "SERVING"
        judge.fail_with = BackendUnavailable("every judge replica is gone")
        await _health_becomes(c, "NOT_SERVING", within_s=1.0)
        assert await c.health("reward.v1.RewardService") == "NOT_SERVING"
        assert "every judge replica is gone" in r.app.server.monitor.down["judge"]
        judge.fail_with = None
        await _health_becomes(c, "SERVING", within_s=1.0)


async def test_an_engine_failure_turns_health_at_once() -> None:
    """Polling rarely (60 s): the failed call itself makes health look again."""
    nli = FakeNLI()
    async with running_server(["server.health_poll_s=60"], nli=nli) as r, \
            r.client(max_retries=0) as c:
        assert await c.health() == "SERVING"
        nli.fail_with = ConnectionResetError("NLI replica connection lost")
        with pytest.raises(RewardCallError) as e:
            await c.score([d.ScoreItem("n", d.NliConstraintsSpec("Paris is big.", "Paris", "big"))])
        assert e.value.code is grpc.StatusCode.UNAVAILABLE
        await _health_becomes(c, "NOT_SERVING", within_s=0.5)
