"""A real grpc.aio server on 127.0.0.1:0 with real engines (fakes by default) and the real client."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import pytest_asyncio

from reward_server.backends.base import JudgeEngine, NLIEngine
from reward_server.backends.fake import FakeJudge, FakeNLI
from reward_server.client import AsyncRewardClient
from reward_server.config import load_config
from reward_server.rpc.server import RewardGrpcServer, create_server
from reward_server.service import RewardService


@dataclass
class Running:
    server: RewardGrpcServer
    port: int
    service: RewardService

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self, **kw: object) -> AsyncRewardClient:
        return AsyncRewardClient(self.target, **kw)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def running_server(
    overrides: Sequence[str] = (),
    *,
    judge: JudgeEngine | None = None,
    nli: NLIEngine | None = None,
) -> AsyncIterator[Running]:
    config = load_config(
        overrides=["server.port=0", "server.drain_delay_s=0", *overrides], env={}
    )
    service = RewardService(config, judge=judge or FakeJudge(), nli=nli or FakeNLI())
    server, port = create_server(config, service)
    await server.start()
    try:
        yield Running(server, port, service)
    finally:
        await server.stop(grace=1.0, drain_delay=0)


@pytest_asyncio.fixture(scope="module")
async def fake_server() -> AsyncIterator[Running]:
    async with running_server(["server.max_batch_items=8", "server.max_text_chars=2000"]) as r:
        yield r
