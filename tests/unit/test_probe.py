"""The start-up probe's one line: what, the status, the fix (reward_server.integrations.probe)."""

from __future__ import annotations

import socket
import time

import grpc
import pytest

from reward_server.client import RewardCallError
from reward_server.integrations.probe import (
    ServerUnreachable,
    address_problem,
    describe,
    probe,
    short_details,
)

REFUSED = ("server at 127.0.0.1:1 unreachable until the call's deadline: failed to connect to all "
           "addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to connect to remote host: "
           "Connection refused")


def test_a_refused_connection_is_named_by_its_cause_on_one_line() -> None:
    assert short_details(REFUSED) == "Connection refused"
    line = describe("127.0.0.1:1", RewardCallError("Info", grpc.StatusCode.UNAVAILABLE, REFUSED,
                                                   attempts=1), timeout_s=10)
    assert line.startswith("reward server 127.0.0.1:1 is not reachable "
                           "(UNAVAILABLE: Connection refused); start it with `reward-server serve")
    assert "--reward-server HOST:PORT" in line and "\n" not in line
    assert "--probe-timeout-s" not in line  # it did not wait: a longer wait would not help
    slow = describe("127.0.0.1:1", RewardCallError("Info", grpc.StatusCode.DEADLINE_EXCEEDED,
                                                   "Deadline Exceeded", attempts=1), timeout_s=10)
    assert "is not reachable within 10 s" in slow and "raise --probe-timeout-s" in slow


def test_a_refused_token_names_the_setting() -> None:
    e = RewardCallError("Info", grpc.StatusCode.UNAUTHENTICATED, "wrong bearer token", attempts=1)
    assert describe("h:1", e).endswith("set $REWARD_SERVER_TOKEN_FILE to a file holding the "
                                       "server's server.auth_token (or $REWARD_SERVER_TOKEN)")
    assert "(or $REWARD_SERVER_TOKEN, --token)" in describe("h:1", e, token_flag="--token")


@pytest.mark.parametrize(("target", "says"), [
    ("http://127.0.0.1:50051", "is a URL"), ("127.0.0.1", "is not HOST:PORT"), ("", "is empty"),
])
def test_addresses_that_are_not_host_port_are_refused(target: str, says: str) -> None:
    problem = address_problem(target)
    assert problem is not None and says in problem


@pytest.mark.parametrize("target", ["127.0.0.1:50051", "a:1,b:2", "[::1]:50051", "dns:///svc:50051"])
def test_good_addresses_pass(target: str) -> None:
    assert address_problem(target) is None


async def test_a_refused_connection_fails_the_probe_at_once() -> None:
    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        target = f"127.0.0.1:{s.getsockname()[1]}"
    start = time.monotonic()
    with pytest.raises(ServerUnreachable) as e:
        await probe(target, timeout_s=10.0)
    assert time.monotonic() - start < 5  # a bound, not a benchmark: it waited 10 s before
    assert isinstance(e.value, RewardCallError) and e.value.code is grpc.StatusCode.UNAVAILABLE
    assert str(e.value).startswith(f"reward server {target} is not reachable (UNAVAILABLE: "
                                   "Connection refused)")


async def test_a_name_that_does_not_resolve_fails_the_probe_at_once() -> None:
    with pytest.raises(ServerUnreachable) as e:
        await probe("no-such-host.invalid:50051", timeout_s=10.0)
    assert "(UNAVAILABLE: Domain name not found)" in str(e.value) or "resolv" in str(e.value)


async def test_a_server_that_connects_but_does_not_answer_is_waited_for_until_the_deadline() -> None:
    with socket.socket() as s:  # accepts connections (the kernel does), never speaks HTTP/2
        s.bind(("127.0.0.1", 0))
        s.listen()
        target = f"127.0.0.1:{s.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(ServerUnreachable):
            await probe(target, timeout_s=1.0)
        assert 0.4 < time.monotonic() - start < 10  # its handshake allowance, then its own 1 s
