"""The start-up probe: one ``Info`` call with a short deadline of its own, before a run or a
command commits to anything, and the one-line message a person can act on when it fails.

A training call rides out a restarting server for ``RetryBudget.deadline_s`` (120 s by
default); the probe must not: a server that is not there at start is a mistake to report in
seconds (address, status, fix), not after two minutes of silence. It does not wait for a
connection gRPC has seen fail (refused, or a name that does not resolve: gRPC's
``wait_for_ready`` off), so that fails at once; only a server that connects but has not answered
yet is waited for, up to its deadline. The trainer, the TRL and verl integrations (first call)
and the CLI's client verbs use it.
"""

from __future__ import annotations

import asyncio
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from reward_server import domain as d
from reward_server.client import (
    MIN_BACKOFF_S,
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    AsyncRewardClient,
    RetryBudget,
    RewardCallError,
    Target,
)

PROBE_TIMEOUT_S = 10.0
"""Default deadline of the start-up probe (waiting for a server that is starting included)."""
_UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class ServerUnreachable(RewardCallError):
    """The start-up probe failed: a :class:`RewardCallError` (``code``, ``details``) whose text
    is one line naming the address, the status and the fix."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str, *, attempts: int,
                 line: str = "") -> None:
        super().__init__(method, code, details, attempts=attempts)
        self.line = line or f"{method} failed with {code.name}: {details}"

    def __str__(self) -> str:
        return self.line


def short_details(details: str) -> str:
    """gRPC's details on one line; for a failed connection only its cause (``Connection
    refused``, ``Domain name not found``), not gRPC's preamble."""
    text = " ".join(details.split())
    if any(s in text for s in ("failed to connect to all addresses", "unreachable until",
                               "connections to all backends failing", "errors resolving")):
        text = text.rsplit(": ", 1)[-1].rstrip("]")
    return text if len(text) <= 200 else text[:197] + "..."


def describe(
    target: Target, error: RewardCallError, *, address_flag: str = "--reward-server",
    timeout_flag: str | None = "--probe-timeout-s", timeout_s: float | None = None,
    token_flag: str | None = None,
) -> str:
    """One line for a failed probe of ``target``: what, the status, and the fix."""
    where = target if isinstance(target, str) else ",".join(map(str, target))
    status = f"{error.code.name}: {short_details(error.details)}"
    if error.code in _UNREACHABLE:
        # UNAVAILABLE: the connection failed at once (refused, no such host); DEADLINE_EXCEEDED:
        # it connected, or kept trying, and no answer came before the probe's deadline
        waited = (f" within {timeout_s:g} s" if timeout_s is not None
                  and error.code is grpc.StatusCode.DEADLINE_EXCEEDED else "")
        more = (f", or raise {timeout_flag} if it is still starting" if timeout_flag
                and error.code is grpc.StatusCode.DEADLINE_EXCEEDED else "")
        return (f"reward server {where} is not reachable{waited} ({status}); start it with "
                f"`reward-server serve ...` (--fake to try the API) or pass {address_flag} "
                f"HOST:PORT{more}")
    if error.code is grpc.StatusCode.UNAUTHENTICATED:
        also = f", {token_flag}" if token_flag else ""
        return (f"reward server {where} refused the call ({status}); set ${TOKEN_FILE_ENV} to a "
                f"file holding the server's server.auth_token (or ${TOKEN_ENV}{also})")
    return f"reward server {where} answered Info with {status}"


async def probe(
    target: Target, *, token: str | None = None, timeout_s: float = PROBE_TIMEOUT_S,
    address_flag: str = "--reward-server", timeout_flag: str | None = "--probe-timeout-s",
    token_flag: str | None = None,
) -> d.ServerInfo:
    """The server's Info within ``timeout_s`` (one call; a connection that fails, fails it at
    once), or :class:`ServerUnreachable` with a one-line message."""
    check_timeout(timeout_s, flag=timeout_flag or "probe_timeout_s")
    # one attempt: the backoff is only gRPC's connect timeout (min_reconnect_backoff), the time
    # a server may take to complete its handshake before the connection counts as failed
    connect_s = max(min(timeout_s / 2, 5.0), MIN_BACKOFF_S)
    budget = RetryBudget(attempts=1, deadline_s=timeout_s, wait_for_ready=False,
                         backoff_initial_s=connect_s, backoff_cap_s=connect_s)
    try:
        async with AsyncRewardClient(target, token=token, retry=budget) as client:
            return await client.info()
    except RewardCallError as e:
        line = describe(target, e, address_flag=address_flag, timeout_flag=timeout_flag,
                        timeout_s=timeout_s, token_flag=token_flag)
        raise ServerUnreachable(e.method, e.code, e.details, attempts=e.attempts, line=line) from None
    except ValueError as e:  # a malformed address (channel_target)
        raise ServerUnreachable("Info", grpc.StatusCode.INVALID_ARGUMENT, str(e), attempts=0,
                                line=f"reward server address {target!r}: {e}") from None


def probe_blocking(target: Target, **kwargs: Any) -> d.ServerInfo:
    """:func:`probe` from synchronous code (on a thread of its own inside a running loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(probe(target, **kwargs))
    with ThreadPoolExecutor(1, thread_name_prefix="reward-probe") as pool:
        return pool.submit(asyncio.run, probe(target, **kwargs)).result()


def check_timeout(timeout_s: float, *, flag: str) -> None:
    if not (timeout_s > 0 and timeout_s < float("inf")):
        raise ValueError(f"{flag} must be a positive number of seconds (got {timeout_s})")


_HOST_PORT = re.compile(r"^\[?[^\s/]+\]?:\d+$")


def address_problem(target: str, *, flag: str = "--reward-server") -> str | None:
    """A one-line complaint when ``target`` is not ``host:port`` (or a list of them, or a gRPC
    URI such as ``dns:///name:port``); None when it looks right."""
    parts = [t.strip() for t in target.split(",") if t.strip()]
    if not parts:
        return f"{flag} is empty; pass HOST:PORT of the reward server"
    for part in parts:
        if "://" in part and not part.startswith(("dns:", "ipv4:", "ipv6:", "unix:")):
            return (f"{flag} {part!r} is a URL; pass HOST:PORT of the gRPC door (e.g. "
                    "127.0.0.1:50051), not http://...")
        if ":" not in part or not (_HOST_PORT.match(part) or part.startswith(
                ("dns:", "ipv4:", "ipv6:", "unix:"))):
            return f"{flag} {part!r} is not HOST:PORT (e.g. 127.0.0.1:50051)"
    return None
