"""A real server's overload (a tiny admission limit): calls wait in the server's line while their
deadline allows; without a line (max_waiting=0) the client rides it out until the call's deadline,
honouring the server's retry pushback, instead of failing after gRPC's 5 attempts."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from reward_server import domain as d
from reward_server.backends.fake import FakeJudge
from reward_server.client import RetryBudget, RewardCallError

from .conftest import running_server

pytestmark = pytest.mark.timeout(90)
RULES = ('The text mentions "coffee".', 'The text mentions "tea".')
TINY = ["service.admission.max_judgments_in_flight=2"]  # one 1-item call (2 rules) at a time
NO_LINE = [*TINY, "service.admission.max_waiting=0"]


def call(i: int) -> list[d.ScoreItem]:
    return [d.ScoreItem(f"c{i}", d.RubricScoreSpec("ctx", f"coffee {i}", RULES))]


async def burst(client: object, n: int) -> list[object]:
    return await asyncio.gather(*(client.score(call(i)) for i in range(n)),  # type: ignore[attr-defined]
                                return_exceptions=True)


async def test_overload_waits_in_line_and_loses_no_call() -> None:
    async with running_server(TINY, judge=FakeJudge(latency_s=0.03)) as r:
        async with r.client(retry=RetryBudget(attempts=1, deadline_s=30.0)) as c:
            out = await burst(c, 48)
        refused = r.service.admission.refused
    assert all(not isinstance(o, BaseException) and o[0].status is d.ItemStatus.OK  # type: ignore[index]
               for o in out), [o for o in out if isinstance(o, BaseException)][:3]
    assert refused == 0  # one attempt each: they waited, nobody was refused


async def test_overload_loses_no_call_whose_deadline_allows_it() -> None:
    async with running_server(NO_LINE, judge=FakeJudge(latency_s=0.03)) as r:
        # gRPC's own retries alone (one round of 5 attempts) lose calls at this overload: the
        # condition the client's deadline-bounded retry must survive
        async with r.client(retry=RetryBudget(attempts=5, deadline_s=30.0)) as c:
            start = time.monotonic()
            out = await burst(c, 48)
            took = time.monotonic() - start
        refused = r.service.admission.refused
    failed = [o for o in out if isinstance(o, BaseException)]
    assert not failed, failed[:3]
    assert all(o[0].status is d.ItemStatus.OK for o in out)  # type: ignore[index]
    assert refused > 5 * 48 // 2  # the server really pushed back, many times per call
    assert took < 30


@pytest.mark.parametrize("overrides", [TINY, NO_LINE], ids=["line", "no-line"])
async def test_past_the_deadline_overload_is_the_servers_status(overrides: list[str]) -> None:
    async with running_server(overrides, judge=FakeJudge(latency_s=0.3)) as r:
        async with r.client(retry=RetryBudget(attempts=5, deadline_s=1.0)) as c:
            start = time.monotonic()
            out = await burst(c, 16)
            took = time.monotonic() - start
    errors = [o for o in out if isinstance(o, RewardCallError)]
    assert errors and len(errors) + sum(not isinstance(o, BaseException) for o in out) == 16
    assert {e.code for e in errors} <= {grpc.StatusCode.RESOURCE_EXHAUSTED,
                                        grpc.StatusCode.DEADLINE_EXCEEDED}
    assert took < 1.0 + 1.5  # bounded by the deadline (plus the server's last answer)


async def test_one_attempt_means_no_retry_even_when_overloaded() -> None:
    async with running_server(NO_LINE, judge=FakeJudge(latency_s=0.1)) as r:
        async with r.client(retry=RetryBudget(attempts=1, deadline_s=30.0)) as c:
            out = await burst(c, 8)
    errors = [o for o in out if isinstance(o, RewardCallError)]
    assert errors and all(e.code is grpc.StatusCode.RESOURCE_EXHAUSTED and e.attempts == 1
                          for e in errors)
