"""A real reward server (fake engines) on 127.0.0.1:0 in a background thread, for sync trainers."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from reward_server.app import RewardApp, start_app
from reward_server.backends.fake import FakeJudge, FakeNLI
from reward_server.config import load_config


class ThreadServer:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.judge = FakeJudge()
        self.nli = FakeNLI()
        self.port = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        self._ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        config = load_config(overrides=[
            "server.port=0", "server.drain_delay_s=0",
            "engines={judge: {kind: fake}, nli: {kind: fake}}",
        ], env={})
        self.app: RewardApp = await start_app(
            config, judge_factory=lambda _s: self.judge, nli_factory=lambda _s: self.nli
        )
        self.port = self.app.port

    def start(self) -> ThreadServer:
        self._thread.start()
        assert self._ready.wait(30), "reward server did not start"
        return self

    def stop(self) -> None:
        fut = asyncio.run_coroutine_threadsafe(self.app.stop(grace=1.0, drain_delay=0), self.loop)
        fut.result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def reward_server() -> Iterator[ThreadServer]:
    server = ThreadServer().start()
    yield server
    server.stop()
