"""A real reward server on 127.0.0.1:0, built by the composition root (reward_server.app) with
the default, batched hosting path; fake engines unless a test passes its own."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import pytest_asyncio

from reward_server.app import RewardApp, start_app
from reward_server.backends.base import JudgeEngine, NLIEngine
from reward_server.backends.fake import FakeJudge, FakeNLI
from reward_server.client import AsyncRewardClient
from reward_server.config import load_config
from reward_server.service import RewardService

FAKE = "engines={judge: {kind: fake}, nli: {kind: fake}}"


@dataclass
class Running:
    app: RewardApp
    judge: JudgeEngine
    nli: NLIEngine

    @property
    def port(self) -> int:
        return self.app.port

    @property
    def service(self) -> RewardService:
        return self.app.hosting.service  # type: ignore[attr-defined,no-any-return]  # a LocalService

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.app.port}"

    def client(self, **kw: object) -> AsyncRewardClient:
        return AsyncRewardClient(self.target, **kw)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def running_server(
    overrides: Sequence[str] = (),
    *,
    judge: JudgeEngine | None = None,
    nli: NLIEngine | None = None,
    build: bool = False,
) -> AsyncIterator[Running]:
    """Start a server through the composition root. ``judge`` / ``nli``: engine instances to
    serve (default: fresh fakes); ``build=True``: build the engines the overrides name."""
    config = load_config(
        overrides=["server.port=0", "server.drain_delay_s=0", FAKE, *overrides], env={}
    )
    if build:
        app = await start_app(config)
        judge, nli = app.hosting.engines.judge, app.hosting.engines.nli  # type: ignore[attr-defined]
    else:
        j, n = judge or FakeJudge(), nli or FakeNLI()
        app = await start_app(config, judge_factory=lambda _s: j, nli_factory=lambda _s: n)
        judge, nli = j, n
    try:
        yield Running(app, judge, nli)
    finally:
        await app.stop(grace=1.0, drain_delay=0)


@pytest_asyncio.fixture(scope="module")
async def fake_server() -> AsyncIterator[Running]:
    async with running_server(
        ["service.limits.max_batch_items=8", "service.limits.max_text_bytes=2000"]
    ) as r:
        yield r
