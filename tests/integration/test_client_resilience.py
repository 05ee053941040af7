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
    config = json.loads(b.service_config())
    assert config["loadBalancingConfig"] == [{"round_robin": {}}]
    (method, probe) = config["methodConfig"]
    assert method["waitForReady"] is True and probe == {"name": [{"service": "grpc.health.v1.Health"}],
                                                        "waitForReady": False}
    assert method["retryPolicy"] == {"maxAttempts": 5, "initialBackoff": "0.100s", "maxBackoff": "2.000s",
                                     "backoffMultiplier": 2,
                                     "retryableStatusCodes": ["CANCELLED", "UNAVAILABLE"]}
    # RESOURCE_EXHAUSTED is the client's own loop (pushback until the deadline; a message over
    # a size cap is the same status and must not be resent)
    assert b.rounds == 3  # 12 attempts: gRPC's cap of 5 per call, so up to 3 calls
    with pytest.raises(ValueError, match="attempts must be >= 1"):
        RetryBudget(attempts=0)
    with pytest.raises(ValueError, match="grpc/grpc#41036"):  # tiny backoffs can hang gRPC's retries
        RetryBudget(backoff_initial_s=0.01)


async def test_a_call_grpc_leaves_hanging_is_cancelled_after_its_deadline(monkeypatch) -> None:
    """grpc/grpc#41036: gRPC core can leave a retried call pending past its deadline. The
    client bounds every call anyway: a stub method that never returns (what such a call looks
    like from Python) ends as DEADLINE_EXCEEDED shortly after the budget."""
    from reward_server.client import client as client_mod

    monkeypatch.setattr(client_mod, "STUCK_GRACE_S", 0.2)

    async def never(request, **kw):
        await asyncio.Event().wait()

    async with AsyncRewardClient("127.0.0.1:1", retry=RetryBudget(deadline_s=0.3, wait_for_ready=False)) as c:
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(RewardCallError) as e:
            await c._call("Score", never, None, None)
        assert e.value.code is grpc.StatusCode.DEADLINE_EXCEEDED and "41036" in e.value.details
        assert asyncio.get_running_loop().time() - t0 < 5.0


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


@pytest.mark.parametrize(("given", "target"), [
    ("10.0.0.1:50051", "10.0.0.1:50051"),
    ("dns:///reward.svc:50051", "dns:///reward.svc:50051"),
    (["10.0.0.1:1"], "10.0.0.1:1"),
    ("10.0.0.1:1, 10.0.0.2:2", "ipv4:10.0.0.1:1,10.0.0.2:2"),
    (["localhost:1", "127.0.0.1:2"], "ipv4:127.0.0.1:1,127.0.0.1:2"),
    (("[::1]:1", "[fe80::2]:2"), "ipv6:[::1]:1,[fe80::2]:2"),
    ("ipv4:10.0.0.1:1,10.0.0.2:2", "ipv4:10.0.0.1:1,10.0.0.2:2"),
])
def test_several_addresses_become_one_round_robin_target(given: object, target: str) -> None:
    from reward_server.client import channel_target

    assert channel_target(given) == target  # type: ignore[arg-type]


@pytest.mark.parametrize(("given", "why"), [
    ("reward-a:1,reward-b:2", "must be IP addresses"),
    (["10.0.0.1:1", "[::1]:2"], "mix IPv4 and IPv6"),
    (["10.0.0.1", "10.0.0.2:2"], "is not host:port"),
    ([], "no server address"),
])
def test_several_addresses_that_grpc_cannot_take_are_refused_with_the_fix(given: object, why: str) -> None:
    from reward_server.client import channel_target

    with pytest.raises(ValueError, match=why):
        channel_target(given)  # type: ignore[arg-type]


async def test_calls_spread_over_several_servers_and_a_dead_one_is_skipped() -> None:
    """gRPC's round_robin over two servers: both get calls; after one is gone every call is
    answered by the other, well inside the deadline (no waiting for the dead one)."""
    ports = [free_port(), free_port()]
    judges = [FakeJudge(), FakeJudge()]
    apps = []
    for port, judge in zip(ports, judges, strict=True):
        config = load_config(overrides=[f"server.port={port}", "server.drain_delay_s=0",
                                        "engines={judge: {kind: fake}, nli: {kind: fake}}"], env={})
        apps.append(await start_app(config, judge_factory=lambda _s, j=judge: j,
                                    nli_factory=lambda _s: FakeNLI()))
    try:
        async with AsyncRewardClient([f"127.0.0.1:{p}" for p in ports],
                                     retry=RetryBudget(deadline_s=10.0)) as c:
            assert c.target == f"ipv4:127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}"
            for s in range(20):
                assert [r.status for r in await c.score(group(0, s, 1))] == [d.ItemStatus.OK]
            assert all(j.batch_sizes for j in judges)  # both servers answered
            await apps.pop().stop(grace=0.5, drain_delay=0)
            served_before = len(judges[0].batch_sizes)
            start = time.monotonic()
            for s in range(20):
                (r,) = await c.score(group(1, s, 1))
                assert r.item_id == f"w1-s{s}-c0" and r.status is d.ItemStatus.OK
            assert time.monotonic() - start < 5.0
            assert len(judges[0].batch_sizes) >= served_before + 20  # all on the live one
    finally:
        for app in apps:
            await app.stop(grace=0.5, drain_delay=0)
