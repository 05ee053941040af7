"""The per-connection limits gRPC core has no setting for (reward_server/rpc/connections.py),
against a real server: the attacker connects from 127.0.0.2 (another loopback address, standing
for another machine), a well-behaved client from 127.0.0.1 is served meanwhile. Each attack is
small and bounded in time; Linux only (the guard reads /proc/self/fd)."""

from __future__ import annotations

import asyncio
import collections
import socket
import sys
import time

import grpc
import pytest

from bench._h2 import RawH2, closed_by_peer, grpc_frame, idle_socket
from reward_server import domain as d
from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server.api import convert
from reward_server.rpc.connections import MAX_EARLY_RESETS
from reward_server.rpc.sockscan import peer_of

from .conftest import Running, running_server

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only"),
              pytest.mark.timeout(120)]
SCORE = "/reward.v1.RewardService/Score"
ATTACKER = "127.0.0.2"
GOOD = pb.ScoreRequest(items=[convert.item_to_proto(
    d.ScoreItem("ok", d.NliConstraintsSpec("Paris is big.", "Paris", "big")))]).SerializeToString()
FAST = ["server.connection_check_s=0.1"]


async def good_calls(r: Running, until: asyncio.Event) -> collections.Counter[str]:
    """A well-behaved client on 127.0.0.1 calling Score back to back until ``until`` is set
    (a fresh channel each time, so a new connection must get in)."""
    codes: collections.Counter[str] = collections.Counter()
    while not until.is_set():
        async with grpc.aio.insecure_channel(r.target) as ch:
            try:
                await ch.unary_unary(SCORE)(GOOD, timeout=10)
                codes["OK"] += 1
            except grpc.aio.AioRpcError as e:
                codes[e.code().name] += 1
        await asyncio.sleep(0.02)
    return codes


async def closes(r: Running, reason: str) -> int:
    """How many connections the guard closed for ``reason``, once it has closed one (it counts
    in its worker thread, after the peer may have seen the close)."""
    guard = r.app.server.guard
    assert guard is not None
    for _ in range(100):
        if guard.closed[reason]:
            break
        await asyncio.sleep(0.02)
    return guard.closed[reason]


def test_grpc_peer_strings_name_the_connection() -> None:
    assert peer_of("ipv4:127.0.0.1:54321") == ("127.0.0.1", 54321)
    assert peer_of("ipv6:[::1]:443") == ("::1", 443)
    assert peer_of("unix:/tmp/s") is None


async def test_a_peer_at_its_share_gets_no_more_connections_and_others_get_in() -> None:
    """Ten connections tried from one address with a share of four: at most four stay open
    (those past it that got in before the guard looked are closed, the most idle first), the
    rest are dropped by the kernel; another address gets in meanwhile, and the peer gets in
    again once it is below its share."""
    async with running_server([*FAST, "server.max_connections_per_peer=4"]) as r:
        guard = r.app.server.guard
        assert guard is not None

        def attacker() -> socket.socket | None:
            try:
                return idle_socket(r.port, source=ATTACKER, connect_timeout_s=1.0)
            except OSError:
                return None

        socks = [k for k in await asyncio.gather(*(asyncio.to_thread(attacker)
                                                   for _ in range(10))) if k is not None]
        try:
            for _ in range(100):
                if ATTACKER in guard.blocked and \
                        sum(not closed_by_peer(k) for k in socks) <= 4:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # nothing more closed
            open_now = [k for k in socks if not closed_by_peer(k)]
            assert await asyncio.to_thread(attacker) is None  # dropped: at its share
            async with grpc.aio.insecure_channel(r.target) as ch:  # another peer gets in
                assert pb.ScoreResponse.FromString(
                    await ch.unary_unary(SCORE)(GOOD, timeout=10)).results[0].id == "ok"
            assert len(open_now) == 4
            assert guard.closed["per_peer"] == len(socks) - 4
            open_now[0].close()
            for _ in range(100):
                if ATTACKER not in guard.blocked:
                    break
                await asyncio.sleep(0.05)
            again = await asyncio.to_thread(attacker)
            assert again is not None
            again.close()
        finally:
            for k in socks:
                k.close()


async def test_rapid_reset_gets_the_connection_closed_and_others_are_served() -> None:
    """CVE-2023-44487: streams reset right after their headers, as fast as they go. gRPC core
    hands each to the server; past MAX_EARLY_RESETS of them the connection is closed and the
    address gets no new connection for a while. A good client meanwhile loses no call (none
    CANCELLED)."""
    async with running_server(FAST) as r:
        stop = asyncio.Event()
        good = asyncio.create_task(good_calls(r, stop))
        raw = await RawH2.open(r.port, source=ATTACKER)
        t0 = time.monotonic()
        sent = 0
        try:
            while not raw.closed and raw.goaway is None and time.monotonic() - t0 < 20:
                sent += await raw.rapid_reset(SCORE, 200)
            closed = await raw.wait_closed_by_peer(5.0) or raw.closed
        finally:
            await raw.close()
            stop.set()
        codes = await good
        resets = await closes(r, "rapid_reset")
        guard = r.app.server.guard
        assert guard is not None
        for _ in range(50):
            if ATTACKER in guard.blocked:
                break
            await asyncio.sleep(0.02)
        with pytest.raises(OSError):  # kept out: the connection request gets no answer
            await asyncio.to_thread(idle_socket, r.port, source=ATTACKER, connect_timeout_s=1.0)
    assert closed and resets >= 1, sent
    assert sent >= MAX_EARLY_RESETS
    assert set(codes) == {"OK"}, codes


async def test_a_connection_that_keeps_calls_waiting_for_their_request_is_closed() -> None:
    """100 calls (over half of server.max_concurrent_streams, 128) whose request never comes:
    the connection is closed after two looks, the calls with it; a good client is served."""
    async with running_server(FAST) as r:
        stop = asyncio.Event()
        good = asyncio.create_task(good_calls(r, stop))
        raw = await RawH2.open(r.port, source=ATTACKER)
        try:
            await raw.start_calls(SCORE, 100, body=None)
            closed = await raw.wait_closed_by_peer(10.0)
        finally:
            await raw.close()
            stop.set()
        codes = await good
        waiting = await closes(r, "waiting")
    assert closed and waiting == 1
    assert set(codes) == {"OK"}, codes


async def test_a_header_block_that_never_ends_is_cut_off() -> None:
    """A CONTINUATION flood (a HEADERS frame, then CONTINUATION frames that never end the
    block): gRPC core reads and drops it for as long as it comes; the guard closes the
    connection once it has sent a request's worth of bytes (server.max_message_bytes, 1 MiB
    here, + 16 MiB) that became no request."""
    async with running_server([*FAST, "server.max_message_bytes=1048576"]) as r:
        raw = await RawH2.open(r.port, source=ATTACKER)
        await raw.pump(0.1)
        try:
            sent = await raw.continuation_flood(SCORE, 2 << 30, timeout_s=30.0)
        finally:
            await raw.close()
        unread = await closes(r, "unread")
    assert unread == 1
    assert sent < 512 * 2**20, f"{sent / 2**20:.0f} MiB taken before the connection was closed"


async def test_a_trainers_connection_with_many_calls_in_flight_is_left_alone() -> None:
    """128 calls at once on one connection (its stream limit), all but one waiting in
    admission's line (a limit of 16 judgments: one call at a time): none of the limits above
    closes it (calls in the line have not asked for their request yet)."""
    async with running_server([*FAST, "service.admission.max_judgments_in_flight=16"]) as r:
        raw = await RawH2.open(r.port)
        try:
            sids = await raw.start_calls(SCORE, 128, body=grpc_frame(GOOD))
            statuses = [await raw.grpc_status(sid, 30.0) for sid in sids]
        finally:
            await raw.close()
        guard = r.app.server.guard
        assert guard is not None
    assert [s[0] if s else None for s in statuses] == [0] * 128
    assert not guard.closed
