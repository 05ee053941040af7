"""The client's channel policy: targets (one address, several for gRPC's round robin, or a
``dns:``/``ipv4:``/``unix:`` name) and the :class:`RetryBudget` that becomes the channel's gRPC
service config (``waitForReady``, ``retryPolicy``, ``loadBalancingConfig``) and reconnect
backoff. Used by :mod:`reward_server.client.client`; needs only grpcio."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import math
import random
from collections.abc import Sequence
from typing import Any

import grpc

# CANCELLED as a status (not a local asyncio cancellation, which raises CancelledError) comes
# from the server's side: gRPC core cancels calls it has received but not yet handed to the
# application when the server's port closes (grpc/grpc#41785; a restart or a drain). Our
# server never answers CANCELLED itself (a leaked cancellation is UNAVAILABLE), and every
# reward.v1 call is idempotent, so such a call is resent like UNAVAILABLE.
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
                       grpc.StatusCode.CANCELLED})
MIN_BACKOFF_S = 0.1  # shorter retry backoffs can hang a call in gRPC core (grpc/grpc#41036)
GRPC_MAX_ATTEMPTS = 5  # gRPC clamps retryPolicy.maxAttempts to this
SERVICE = "reward.v1.RewardService"
HEALTH = "grpc.health.v1.Health"  # a probe: no waiting, no retries
_SCHEMES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:", "vsock:")
Target = str | Sequence[str]


def channel_target(target: Target) -> str:
    """The gRPC target for one server or several.

    One ``host:port`` (or any target with a scheme, ``dns:///name:port`` included) is used as
    it is. Several addresses (a list, or one string with commas) become gRPC's static
    ``ipv4:a:p,b:q`` (or ``ipv6:[a]:p,...``) target, which round robin spreads calls over;
    they must be IP addresses (``localhost`` counts as 127.0.0.1): for host names use one DNS
    name that resolves to all of them.
    """
    if isinstance(target, str):
        if target.startswith(_SCHEMES) or "," not in target:
            return target.strip()
        target = target.split(",")
    addresses = [a.strip() for a in target if a.strip()]
    if not addresses:
        raise ValueError("no server address given: pass host:port, or several of them")
    if len(addresses) == 1:
        return addresses[0]
    v4: list[str] = []
    v6: list[str] = []
    for a in addresses:
        host, sep, port = a.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"server address {a!r} is not host:port")
        host = "127.0.0.1" if host == "localhost" else host
        try:
            ip = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            raise ValueError(
                f"several server addresses must be IP addresses ({a!r} is not): gRPC's "
                "ipv4:/ipv6: targets hold no host names; for names, give one DNS name that "
                "resolves to every server (dns:///reward.example:50051) or a load balancer"
            ) from None
        (v4 if ip.version == 4 else v6).append(f"{ip}:{port}" if ip.version == 4 else f"[{ip}]:{port}")
    if v4 and v6:
        raise ValueError(f"server addresses mix IPv4 and IPv6 ({addresses}); gRPC's static "
                         "targets take one family: give one DNS name that resolves to all")
    return ("ipv4:" + ",".join(v4)) if v4 else ("ipv6:" + ",".join(v6))


@dataclasses.dataclass(frozen=True)
class RetryBudget:
    """How long and how often one call may try. The defaults ride out a reward-server restart
    or a rolling update of ~30 s and then fail with the server's last status."""

    attempts: int = 5
    """Tries of a call answered UNAVAILABLE or CANCELLED (1 = no retry). Above gRPC's cap of 5
    per call it runs in rounds of 5: rounded up to a multiple of 5. RESOURCE_EXHAUSTED (the
    server's pushback) is retried until ``deadline_s`` instead, unless this is 1."""
    backoff_initial_s: float = 0.2
    """First retry backoff; doubles per retry (gRPC adds jitter). At least 0.1 s: with
    shorter backoffs gRPC core (1.7x-1.8x) can leave a retried call hanging past its deadline
    (grpc/grpc#41036; seen here at 0.01 s under load)."""
    backoff_cap_s: float = 5.0
    """Longest backoff between retries and between reconnect attempts."""
    deadline_s: float = 120.0
    """One call in all: attempts, backoffs and waiting for the server to come back."""
    wait_for_ready: bool = True
    """Wait for an unreachable server (until the deadline) instead of failing at once."""

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1 (got {self.attempts}); 1 means no retry")
        if not (MIN_BACKOFF_S <= self.backoff_initial_s <= self.backoff_cap_s):
            raise ValueError(
                f"need {MIN_BACKOFF_S} <= backoff_initial_s ({self.backoff_initial_s}) <= "
                f"backoff_cap_s ({self.backoff_cap_s}); shorter backoffs only hammer a failing "
                "server (and gRPC core's retries are buggy with tiny ones, grpc/grpc#41036)"
            )
        if not (self.deadline_s > 0 and math.isfinite(self.deadline_s)):
            raise ValueError(f"deadline_s must be a positive number of seconds (got {self.deadline_s})")

    @property
    def grpc_attempts(self) -> int:
        """maxAttempts of the channel's retryPolicy (gRPC's cap applied)."""
        return min(self.attempts, GRPC_MAX_ATTEMPTS)

    @property
    def rounds(self) -> int:
        """Calls the client makes at most: rounds of up to ``grpc_attempts`` gRPC attempts."""
        return math.ceil(self.attempts / self.grpc_attempts)

    def service_config(self) -> str:
        """The channel's gRPC service config (JSON): round_robin over the target's addresses,
        waitForReady and the retryPolicy of the reward service; health checks stay probes
        (fail fast, no retry)."""
        method: dict[str, Any] = {"name": [{"service": SERVICE}], "waitForReady": self.wait_for_ready}
        if self.grpc_attempts > 1:
            method["retryPolicy"] = {
                "maxAttempts": self.grpc_attempts,
                "initialBackoff": f"{self.backoff_initial_s:.3f}s",
                "maxBackoff": f"{self.backoff_cap_s:.3f}s",
                "backoffMultiplier": 2,
                # RESOURCE_EXHAUSTED is resent by the client itself, on the server's pushback
                # until the deadline: gRPC would also resend a message over a size cap (the
                # same status), seconds of backoff before the client can say what is wrong
                "retryableStatusCodes": sorted(c.name for c in RETRYABLE - {
                    grpc.StatusCode.RESOURCE_EXHAUSTED}),
            }
        probe = {"name": [{"service": HEALTH}], "waitForReady": False}
        return json.dumps({"loadBalancingConfig": [{"round_robin": {}}],
                           "methodConfig": [method, probe]})

    def channel_options(self) -> list[tuple[str, Any]]:
        cap_ms = int(self.backoff_cap_s * 1000)
        first_ms = min(cap_ms, max(100, int(self.backoff_initial_s * 1000)))
        return [
            ("grpc.service_config", self.service_config()),
            ("grpc.enable_retries", 1),
            # reconnect promptly once the server is back (gRPC's default backoff grows to 120 s)
            ("grpc.initial_reconnect_backoff_ms", first_ms),
            ("grpc.min_reconnect_backoff_ms", first_ms),
            ("grpc.max_reconnect_backoff_ms", cap_ms),
        ]


def backoff_delays(
    rounds: int, *, base_s: float, cap_s: float, rng: random.Random
) -> list[float]:
    """Full-jitter exponential backoff between rounds: round k sleeps U(0, min(cap, base * 2**k))."""
    return [rng.uniform(0.0, min(cap_s, base_s * 2**k)) for k in range(rounds)]


def _budget(
    retry: RetryBudget | None,
    *,
    timeout_s: float | None,
    max_retries: int | None,
    backoff_base_s: float | None,
    backoff_cap_s: float | None,
) -> RetryBudget:
    budget = retry or RetryBudget()
    changes: dict[str, Any] = {}
    if timeout_s is not None:
        changes["deadline_s"] = timeout_s
    if max_retries is not None:
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        changes["attempts"] = max_retries + 1
    if backoff_base_s is not None:
        changes["backoff_initial_s"] = backoff_base_s
    if backoff_cap_s is not None:
        changes["backoff_cap_s"] = backoff_cap_s
    return dataclasses.replace(budget, **changes) if changes else budget
