"""The client's retry budget under a training-shaped load (GRPO batches from several workers):
a reward-server restart within the budget loses no sample; past it, the call fails with the
server's status (the connection error the channel saw), within the deadline."""

from __future__ import annotations

import asyncio
import socket
import time

import grpc
import pytest

from reward_server import domain as d
from reward_server.app import RewardApp, start_app
from reward_server.backends.fake import FakeJudge, FakeNLI
from reward_server.client import AsyncRewardClient, RetryBudget, RewardCallError
from reward_server.config import load_config

pytestmark = pytest.mark.timeout(120)
RULES = ('The text mentions "coffee".', 'The text mentions "tea".')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def serve(port: int) -> RewardApp:
    config = load_config(overrides=[f"server.port={port}", "server.drain_delay_s=0",
                                    "engines={judge: {kind: fake}, nli: {kind: fake}}"], env={})
    return await start_app(config, judge_factory=lambda _s: FakeJudge(latency_s=0.02),
                           nli_factory=lambda _s: FakeNLI())


def group(worker: int, step: int, n: int = 8) -> list[d.ScoreItem]:
    """One prompt's n completions, as a GRPO step sends them."""
    return [d.ScoreItem(f"w{worker}-s{step}-c{i}", d.RubricScoreSpec("ctx", f"coffee {i} tea {step}", RULES))
            for i in range(n)]


async def test_a_restart_within_the_budget_loses_no_sample() -> None:
    port = free_port()
    app = await serve(port)
    sent: list[str] = []
    got: list[str] = []
    budget = RetryBudget(deadline_s=30.0, backoff_cap_s=0.5)

    async def trainer_worker(w: int) -> None:
        async with AsyncRewardClient(f"127.0.0.1:{port}", retry=budget) as c:
            for s in range(12):
                items = group(w, s)
                sent.extend(i.item_id for i in items)
                results = await c.score(items)
                assert [r.status for r in results] == [d.ItemStatus.OK] * len(items)
                got.extend(r.item_id for r in results)
                await asyncio.sleep(0.05)

    load = asyncio.gather(*(trainer_worker(w) for w in range(4)))
    await asyncio.sleep(0.4)
    await app.stop(grace=0.5, drain_delay=0)  # a restart: the server is away for ~2 s
    away = time.monotonic()
    await asyncio.sleep(2.0)
    app = await serve(port)
    back = time.monotonic() - away
    try:
        await asyncio.wait_for(load, 60)
    finally:
        await app.stop(grace=1.0, drain_delay=0)
    assert back >= 2.0
    assert sorted(got) == sorted(sent) and len(sent) == 4 * 12 * 8  # every sample scored once


async def test_past_the_budget_the_call_fails_with_the_servers_status() -> None:
    port = free_port()  # nothing listens: the server is gone for good
    start = time.monotonic()
    async with AsyncRewardClient(f"127.0.0.1:{port}", retry=RetryBudget(deadline_s=2.0)) as c:
        with pytest.raises(RewardCallError) as e:
            await c.score(group(0, 0, 2))
    took = time.monotonic() - start
    assert e.value.code is grpc.StatusCode.UNAVAILABLE
    assert "unreachable until the call's deadline" in e.value.details
    assert "Connection refused" in e.value.details  # what the connection attempts saw
    assert 1.5 <= took < 5.0  # it waited for the server, within the deadline


def test_the_budget_is_grpcs_service_config() -> None:
    import json

    b = RetryBudget(attempts=12, backoff_initial_s=0.1, backoff_cap_s=2.0, deadline_s=60.0)
    (method, probe) = json.loads(b.service_config())["methodConfig"]
    assert method["waitForReady"] is True and probe == {"name": [{"service": "grpc.health.v1.Health"}],
                                                        "waitForReady": False}
    assert method["retryPolicy"] == {"maxAttempts": 5, "initialBackoff": "0.100s", "maxBackoff": "2.000s",
                                     "backoffMultiplier": 2,
                                     "retryableStatusCodes": ["CANCELLED", "RESOURCE_EXHAUSTED", "UNAVAILABLE"]}
    assert b.rounds == 3  # 12 attempts: gRPC's cap of 5 per call, so up to 3 calls
    with pytest.raises(ValueError, match="attempts must be >= 1"):
        RetryBudget(attempts=0)


def test_a_restart_may_reuse_the_port_but_a_live_listener_still_refuses_it() -> None:
    from reward_server.app import check_port_free
    from reward_server.errors import ConfigError

    with socket.socket() as live:
        live.bind(("127.0.0.1", 0))
        live.listen()
        with pytest.raises(ConfigError, match="cannot bind"):
            check_port_free("127.0.0.1", live.getsockname()[1])
    # the restart test above rebinds its port right after the first server closed its
    # connections (TIME_WAIT): that must pass the check
