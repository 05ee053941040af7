"""server.reuse_port: several server processes on one port (here two apps in one process,
which the kernel treats alike), connections spread over them, one going away leaves the other."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence

import grpc
import pytest

from reward_server import domain as d
from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server.api import convert
from reward_server.app import RewardApp, start_app
from reward_server.backends.base import NLIPair, NLIScore
from reward_server.backends.fake import FakeJudge, FakeNLI
from reward_server.config import load_config
from reward_server.errors import ConfigError

from .conftest import FAKE

SCORE = "/reward.v1.RewardService/Score"
ITEM = d.ScoreItem("ok", d.NliConstraintsSpec("Paris is big.", "Paris", "big"))


class CountingNLI(FakeNLI):
    """The fake NLI engine, counting the pairs it scored (which server answered)."""

    def __init__(self) -> None:
        super().__init__()
        self.pairs = 0

    async def entailment(self, pairs: Sequence[NLIPair]) -> list[NLIScore]:
        self.pairs += len(pairs)
        return await super().entailment(pairs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def start(port: int, nli: FakeNLI, *extra: str) -> RewardApp:
    config = load_config(overrides=[f"server.port={port}", "server.drain_delay_s=0", FAKE,
                                    "server.metrics_port=0", *extra], env={})
    return await start_app(config, judge_factory=lambda _s: FakeJudge(), nli_factory=lambda _s: nli)


async def score_on_new_connection(port: int) -> None:
    # a channel of its own: a subchannel pool of its own, so a connection of its own
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}",
                                         options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
        request = pb.ScoreRequest(items=[convert.item_to_proto(ITEM)])
        reply = await ch.unary_unary(SCORE)(request.SerializeToString(), timeout=10)
    (result,) = pb.ScoreResponse.FromString(reply).results
    assert result.id == "ok" and result.status == pb.ITEM_STATUS_OK


async def test_two_servers_share_one_port_with_reuse_port() -> None:
    port, http = free_port(), free_port()
    shared = ["server.reuse_port=true", f"server.http.port={http}"]
    a_nli, b_nli = CountingNLI(), CountingNLI()
    a = await start(port, a_nli, *shared)
    try:
        b = await start(port, b_nli, *shared)
        try:
            assert a.port == b.port == port and a.http is not None and b.http is not None
            assert a.http.port == b.http.port == http
            await asyncio.gather(*(score_on_new_connection(port) for _ in range(24)))
            # the kernel hashes each connection to one listener: both got some of 24
            assert a_nli.pairs > 0 and b_nli.pairs > 0, (a_nli.pairs, b_nli.pairs)
        finally:
            await b.stop(grace=1.0, drain_delay=0)
        before = a_nli.pairs
        for _ in range(4):  # the one left takes every new connection
            await score_on_new_connection(port)
        assert a_nli.pairs > before
    finally:
        await a.stop(grace=1.0, drain_delay=0)


async def test_a_second_server_on_a_port_in_use_fails_and_says_how_to_share_it() -> None:
    port = free_port()
    a = await start(port, FakeNLI())
    try:
        with pytest.raises(ConfigError, match=r"server\.reuse_port=true"):
            await start(port, FakeNLI())
        # sharing needs the option on both sides: the first did not set it
        with pytest.raises(ConfigError, match="cannot bind"):
            await start(port, FakeNLI(), "server.reuse_port=true")
    finally:
        await a.stop(grace=1.0, drain_delay=0)
