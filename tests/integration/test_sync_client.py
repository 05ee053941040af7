"""The synchronous RewardClient works from plain code and from inside a running event loop (a
notebook's), takes the retry budget, and close() ends its thread. The server runs on its own
loop in another thread, as a separate server process would."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from reward_server import domain as d
from reward_server.app import start_app
from reward_server.backends.fake import FakeJudge, FakeNLI
from reward_server.client import RetryBudget, RewardCallError, RewardClient
from reward_server.config import load_config

pytestmark = pytest.mark.timeout(60)
ITEMS = [d.ScoreItem("a", d.RubricScoreSpec("ctx", "I drink coffee.", ('The text mentions "coffee".',)))]


@pytest.fixture(scope="module")
def server_target() -> Iterator[str]:
    ready = threading.Event()
    box: dict[str, object] = {}

    async def serve() -> None:
        config = load_config(overrides=["server.port=0", "server.drain_delay_s=0",
                                        "engines={judge: {kind: fake}, nli: {kind: fake}}"], env={})
        app = await start_app(config, judge_factory=lambda _s: FakeJudge(),
                              nli_factory=lambda _s: FakeNLI())
        stop = asyncio.Event()
        box.update(target=app.target, stop=stop, loop=asyncio.get_running_loop())
        ready.set()
        await stop.wait()
        await app.stop(grace=1.0, drain_delay=0)

    thread = threading.Thread(target=lambda: asyncio.run(serve()), name="test-server")
    thread.start()
    assert ready.wait(30), "the server did not start"
    yield str(box["target"])
    loop, stop = box["loop"], box["stop"]
    assert isinstance(loop, asyncio.AbstractEventLoop) and isinstance(stop, asyncio.Event)
    loop.call_soon_threadsafe(stop.set)
    thread.join(10)


def client_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("RewardClient(")]


def test_from_plain_sync_code(server_target: str) -> None:
    before = len(client_threads())
    with RewardClient(server_target) as client:
        assert len(client_threads()) == before + 1
        [result] = client.score(ITEMS)
        assert result.status is d.ItemStatus.OK and result.reward is not None and result.reward > 0.5
        assert client.info().fake_engines is True
        assert client.health() == "SERVING"
    assert len(client_threads()) == before, "close() must end the client's thread"
    with pytest.raises(RuntimeError, match="closed"):
        client.score(ITEMS)
    client.close()  # idempotent


async def test_inside_a_running_event_loop(server_target: str) -> None:
    asyncio.get_running_loop()  # as in a notebook cell
    before = len(client_threads())
    client = RewardClient(server_target)
    try:
        [result] = client.score(ITEMS)
        assert result.status is d.ItemStatus.OK
        assert client.info().api_version
    finally:
        client.close()
    assert len(client_threads()) == before


def test_the_retry_budget_is_the_callers(server_target: str) -> None:
    budget = RetryBudget(attempts=2, backoff_cap_s=0.5, deadline_s=1.5)
    with RewardClient(server_target, retry=budget) as client:
        assert client.retry == budget
    with RewardClient(server_target, max_retries=0, timeout_s=7) as client:
        assert (client.retry.attempts, client.retry.deadline_s) == (1, 7)
    # nothing listens on port 1: the budget's deadline bounds the call, with the channel's reason
    start = time.monotonic()
    with RewardClient("127.0.0.1:1", retry=budget) as dead, pytest.raises(RewardCallError) as e:
        dead.score(ITEMS)
    assert e.value.code is grpc.StatusCode.UNAVAILABLE
    assert time.monotonic() - start < 10
