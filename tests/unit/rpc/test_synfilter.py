"""The kernel filter that drops new connections of peers at their share
(reward_server/rpc/synfilter.py), on plain loopback sockets: 127.0.0.2 stands for the blocked
peer, 127.0.0.1 and 127.0.0.3 for others. Linux only."""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Iterator

import pytest

from reward_server.rpc import synfilter
from reward_server.rpc.connections import ConnectionGuard
from reward_server.rpc.sockscan import Socket

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
BLOCKED = "127.0.0.2"


def connects(port: int, source: str, timeout_s: float = 1.0) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=timeout_s,
                                 source_address=(source, 0)).close()
        return True
    except OSError:
        return False


@pytest.fixture(params=[(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::")],
                ids=["ipv4", "dual-stack"])
def listener(request: pytest.FixtureRequest) -> Iterator[socket.socket]:
    family, host = request.param
    with socket.socket(family) as srv:
        srv.bind((host, 0))
        srv.listen(64)
        yield srv


def test_new_connections_of_a_blocked_address_are_dropped_and_others_get_in(
        listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    open_before = socket.create_connection(("127.0.0.1", port), source_address=(BLOCKED, 0))
    accepted, _ = listener.accept()
    with open_before, accepted:
        synfilter.attach(listener.fileno(), [BLOCKED, "::2"])
        assert not connects(port, BLOCKED)
        assert connects(port, "127.0.0.1") and connects(port, "127.0.0.3")
        open_before.sendall(b"still")  # a connection open before the block keeps working
        assert accepted.recv(5) == b"still"
        synfilter.attach(listener.fileno(), [])
        assert connects(port, BLOCKED, timeout_s=5.0)


def test_the_program_checks_ipv6_sources_word_by_word() -> None:
    """Each IPv6 address is 9 instructions (4 loads, 4 compares, a drop); an IPv4-mapped one is
    the IPv4 address (2); the fixed part is 8, the IPv4 block's load and accept 2, the end 1."""
    assert len(synfilter.program([])) == 8 * (8 + 2 + 1)
    assert len(synfilter.program(["10.0.0.1", "::ffff:10.0.0.2"])) == 8 * (11 + 2 * 2)
    assert len(synfilter.program(["2001:db8::1"])) == 8 * (11 + 9)


def test_the_guard_blocks_a_peer_at_its_share_and_closes_the_most_idle_past_it() -> None:
    guard = ConnectionGuard(1, max_connections=None, per_peer=2, max_streams=128,
                            max_message=1 << 20, every_s=1.0)
    busy = [Socket(10 + i, ("10.0.0.1", 1000 + i), 0, idle_ms=i) for i in range(5)]
    at_share = [Socket(20 + i, ("10.0.0.2", 2000 + i), 0, idle_ms=0) for i in range(2)]
    under = [Socket(30, ("10.0.0.3", 3000), 0, idle_ms=0)]
    closing = guard._judge([*busy, *at_share, *under])
    assert sorted(s.conn[1] for s, _why, reason in closing if reason == "per_peer") == \
        [1002, 1003, 1004]  # the three most idle of five, with a share of two
    assert guard._block == {"10.0.0.1", "10.0.0.2"}
    guard._judge([*busy[:1], *at_share, *under])
    assert guard._block == {"10.0.0.2"}  # one below its share: let in again


def test_where_the_kernel_refuses_the_filter_the_guard_says_so_and_closes_instead(
        caplog: pytest.LogCaptureFixture) -> None:
    guard = ConnectionGuard(1, max_connections=None, per_peer=2, max_streams=128,
                            max_message=1 << 20, every_s=1.0)
    read, write = os.pipe()  # not a socket: setsockopt fails as an unsupported kernel's would
    try:
        with caplog.at_level(logging.WARNING, logger="reward_server.rpc.connections"):
            guard._set_filter(frozenset({"10.0.0.1"}), [read])
            guard._set_filter(frozenset({"10.0.0.1"}), [read])  # not tried again
    finally:
        os.close(read)
        os.close(write)
    assert guard.blocked == frozenset()
    said = [r.getMessage() for r in caplog.records if "cannot drop" in r.getMessage()]
    assert len(said) == 1 and "on port 1" in said[0] and "closed instead" in said[0]
