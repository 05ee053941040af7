"""Python client for reward.v1: ``AsyncRewardClient`` (the synchronous ``RewardClient`` wraps it,
:mod:`reward_server.client.sync`).

Needs only grpcio and protobuf. A failure is never turned into a reward: every call either
returns the server's answer or raises :class:`RewardCallError` with the server's status.

Resilience comes from gRPC itself, configured from one :class:`RetryBudget`:

- ``waitForReady`` (service config): while the server is away (restart, rolling update) a
  call waits for the channel to reconnect instead of failing at once; reconnect attempts are
  gRPC's own jittered exponential backoff, capped at ``backoff_cap_s``.
- ``retryPolicy`` (service config): a call the server answers UNAVAILABLE or
  RESOURCE_EXHAUSTED, or that gRPC cancelled at the server's shutdown (CANCELLED), is retried
  by gRPC with jittered exponential backoff (honouring the
  server's ``grpc-retry-pushback-ms``), up to ``attempts``.
- one deadline per call (``deadline_s``) bounds all of it.
- ``round_robin`` load balancing (service config): the target may name several servers (a
  list, ``"10.0.0.1:50051,10.0.0.2:50051"``, ``ipv4:...`` or a ``dns:///name:port`` that
  resolves to several addresses, e.g. a Kubernetes headless Service). gRPC keeps a
  subchannel to each and spreads calls over the ready ones; a server that goes away drops out
  of the rotation (its calls in flight fail UNAVAILABLE and the retryPolicy resends them to
  a live one), and is used again once it reconnects.

gRPC caps ``maxAttempts`` at 5 (larger values are clamped). For a budget above 5 attempts the
client repeats the call in rounds of up to 5 gRPC attempts, sleeping a full-jitter backoff
(capped at ``backoff_cap_s``) between rounds, all inside the same deadline. When the deadline
passes while the server is unreachable, the error is the channel's own UNAVAILABLE status
(e.g. ``failed to connect to all addresses; ... Connection refused``), not a bare
DEADLINE_EXCEEDED.

Overload is not a failure: a call answered RESOURCE_EXHAUSTED (the server's admission is full)
after gRPC's own retries is resent after the server's ``grpc-retry-pushback-ms`` (jittered)
until the call's deadline, however many attempts that takes (unless ``attempts`` is 1: no
retry). It fails RESOURCE_EXHAUSTED only when the next retry would pass the deadline.

``coalesce=CoalesceSettings()`` (opt-in) merges concurrent small Score calls on this client
into one call (:mod:`reward_server.client.coalesce`); verl's integration turns it on.

    async with AsyncRewardClient("127.0.0.1:50051") as client:
        results = await client.score([ScoreItem(...)])
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, TypeVar

import grpc

from reward_server import domain as d
from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server._proto.reward.v1 import reward_pb2_grpc as pb_grpc
from reward_server.api import convert
from reward_server.client.channel import (  # re-exported in __all__: the client's public API
    GRPC_MAX_ATTEMPTS,
    HEALTH,
    MIN_BACKOFF_S,
    RETRYABLE,
    SERVICE,
    RetryBudget,
    Target,
    _budget,
    backoff_delays,
    channel_target,
)
from reward_server.client.coalesce import Coalescer, CoalesceSettings
from reward_server.errors import RewardServerError

__all__ = [
    "GRPC_MAX_ATTEMPTS", "HEALTH", "MIN_BACKOFF_S", "RETRYABLE", "SERVICE", "STUCK_GRACE_S",
    "AsyncRewardClient", "CoalesceSettings", "RetryBudget", "RewardCallError", "Target",
    "backoff_delays", "channel_target",
]
logger = logging.getLogger(__name__)
T = TypeVar("T")
STUCK_GRACE_S = 5.0  # a call gRPC has not ended this long after its deadline is cancelled here
PUSHBACK_KEY = "grpc-retry-pushback-ms"
# our own count of overload refusals before a resend (gRPC strips grpc-previous-rpc-attempts
# set by an application); the server orders waiting retries by it
PREVIOUS_ATTEMPTS_KEY = "reward-previous-attempts"
_MIN_CALL_S = 0.05  # an overloaded call is resent only if at least this is left after the wait
_MERGED_GRACE_S = 1.0  # a merged caller waits this past its deadline (the call's own error first)


class RewardCallError(RewardServerError):
    """A call failed; ``code`` is the gRPC status and ``details`` the server's message.

    ``attempts`` counts the calls this client made (rounds); gRPC's own retries inside a
    round are not visible to the client.
    """

    def __init__(self, method: str, code: grpc.StatusCode, details: str, *, attempts: int) -> None:
        self.method = method
        self.code = code
        self.details = details
        self.attempts = attempts
        super().__init__(f"{method} failed with {code.name}: {details}")

    def __reduce__(self) -> tuple[Any, ...]:
        # pickle rebuilds an exception as ``type(e)(*e.args)`` (args: the message alone), which
        # this constructor refuses; Ray pickles a remote task's exception, so rebuild from the
        # fields (``__dict__`` restores them and any notes)
        return (functools.partial(type(self), attempts=self.attempts),
                (self.method, self.code, self.details), self.__dict__)


def _pushback_s(e: grpc.aio.AioRpcError) -> float | None:
    """The server's ``grpc-retry-pushback-ms`` (gRFC A6) in seconds, if it sent one."""
    trailers: Any = e.trailing_metadata()  # grpc.aio.Metadata (the stubs say a tuple)
    value = trailers.get(PUSHBACK_KEY) if trailers else None
    try:
        ms = int(value) if value is not None else -1
    except (TypeError, ValueError):
        return None
    return ms / 1000 if ms >= 0 else None


_TOO_LARGE = re.compile(r"(SERVER|CLIENT): (Received|Sent) message larger than max \((\d+) vs\. (\d+)\)")


def _too_large(code: grpc.StatusCode, details: str) -> str | None:
    """gRPC's refusal of a message over a side's size cap (RESOURCE_EXHAUSTED, like overload,
    but no retry can help): what happened and how to fix it; None for anything else."""
    m = _TOO_LARGE.search(details) if code is grpc.StatusCode.RESOURCE_EXHAUSTED else None
    if m is None:
        return None
    side, verb, size, cap = m.groups()
    if side == "SERVER" and verb == "Received":
        return (f"the request is {int(size):,} bytes, over the server's message cap of "
                f"{int(cap):,} (server.max_message_bytes); send fewer or shorter items per call")
    if side == "CLIENT" and verb == "Sent":
        return (f"the request is {int(size):,} bytes, over this client's max_message_bytes of "
                f"{int(cap):,}; send fewer or shorter items per call")
    return (f"a response of {int(size):,} bytes is over the message cap of {int(cap):,} "
            f"({side.lower()} side: the client's max_message_bytes or the server's "
            "server.max_message_bytes); ask for fewer items per call")


def _one_callers_fault(e: BaseException) -> bool:
    """A merged call refused for what one caller sent, or too large as a whole (resent caller
    by caller)."""
    return isinstance(e, RewardCallError) and (
        e.code is grpc.StatusCode.INVALID_ARGUMENT or _too_large(e.code, e.details) is not None)


class AsyncRewardClient:
    """Async client. ``target`` is ``host:port``, or several servers (see
    :func:`channel_target`: a list, comma-separated, or a DNS name) that calls are spread over
    round robin; ``token`` adds ``authorization: Bearer``.

    ``retry`` is the budget of every call. ``timeout_s`` (the per-call deadline),
    ``max_retries`` (attempts - 1), ``backoff_base_s`` and ``backoff_cap_s`` are shorthands
    that override the matching field of ``retry``.
    """

    def __init__(
        self,
        target: Target,
        *,
        token: str | None = None,
        retry: RetryBudget | None = None,
        timeout_s: float | None = None,
        max_retries: int | None = None,
        backoff_base_s: float | None = None,
        backoff_cap_s: float | None = None,
        tls_root_cert: bytes | None = None,
        max_message_bytes: int = 64 * 1024 * 1024,
        seed: int | None = None,
        coalesce: CoalesceSettings | None = None,
    ) -> None:
        self.retry = _budget(retry, timeout_s=timeout_s, max_retries=max_retries,
                             backoff_base_s=backoff_base_s, backoff_cap_s=backoff_cap_s)
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            *self.retry.channel_options(),
        ]
        self._tls_root_cert = tls_root_cert
        self.target = channel_target(target)
        self._channel = self._open(self.target, options)
        self._stub = pb_grpc.RewardServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._rng = random.Random(seed)
        # opt-in: merging adds up to window_s of latency and shares a call's fate among callers
        self._coalescer = None if coalesce is None else Coalescer(
            self._score_now, coalesce, split_on=_one_callers_fault)

    def _open(self, target: str, options: list[tuple[str, Any]]) -> grpc.aio.Channel:
        if self._tls_root_cert is not None:
            creds = grpc.ssl_channel_credentials(root_certificates=self._tls_root_cert)
            return grpc.aio.secure_channel(target, creds, options=options)
        return grpc.aio.insecure_channel(target, options=options)

    @property
    def timeout_s(self) -> float:
        return self.retry.deadline_s

    async def __aenter__(self) -> AsyncRewardClient:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close(grace=None)

    async def _call(
        self,
        method: str,
        fn: Callable[..., Awaitable[T]],
        request: Any,
        timeout_s: float | None,
        *,
        wait_for_ready: bool | None = None,
        rounds: int | None = None,
    ) -> T:
        budget = self.retry
        wfr = budget.wait_for_ready if wait_for_ready is None else wait_for_ready
        deadline = time.monotonic() + (timeout_s or budget.deadline_s)
        delays = backoff_delays((rounds or budget.rounds) - 1, base_s=budget.backoff_initial_s,
                                cap_s=budget.backoff_cap_s, rng=self._rng)
        made = overloaded = 0
        while True:
            made += 1
            left = deadline - time.monotonic()
            # keep a moment to ask the channel why, should the server stay away
            reserve = min(1.0, 0.1 * left) if wfr else 0.0
            timeout = max(left - reserve, 0.001)
            try:
                # gRPC ends the call at its deadline; the outer bound only catches a call gRPC
                # core itself left hanging (grpc/grpc#41036), so no call outlives its budget
                # a call resent on pushback says so: the server lets retried work go first
                metadata = (self._metadata if not overloaded else
                            (*self._metadata, (PREVIOUS_ATTEMPTS_KEY, str(overloaded))))
                return await asyncio.wait_for(
                    fn(request, timeout=timeout, metadata=metadata, wait_for_ready=wfr),
                    timeout + STUCK_GRACE_S)
            except grpc.aio.AioRpcError as e:
                code, details, pushback_s = e.code(), e.details() or "", _pushback_s(e)
            except TimeoutError:
                raise RewardCallError(
                    method, grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"gRPC did not end the call {STUCK_GRACE_S:.0f} s after its deadline; cancelled "
                    "by the client (grpc/grpc#41036)", attempts=made) from None
            if code is grpc.StatusCode.DEADLINE_EXCEEDED and wfr and self._unreachable():
                code, details = await self._why_unreachable(method, request, reserve)
                raise RewardCallError(method, code, details, attempts=made)
            too_large = _too_large(code, details)
            if too_large is not None:  # not overload: resending the same bytes cannot help
                raise RewardCallError(method, code, f"{too_large} ({details})", attempts=made)
            left = deadline - time.monotonic()
            if code is grpc.StatusCode.RESOURCE_EXHAUSTED and budget.attempts > 1:
                # the server is up and says when to come back: wait for it until the deadline,
                # not for a number of attempts (an overloaded server loses no reward in time)
                overloaded += 1
                delay = self._overload_delay(pushback_s, overloaded)
                if delay + _MIN_CALL_S < left:
                    logger.debug("%s: overloaded (%s); retry %d in %.3fs", method, details,
                                 overloaded, delay)
                    await asyncio.sleep(delay)
                    continue
                details += (f" (server overloaded: retried {overloaded - 1} times; the next "
                            f"retry, in {delay:.2f} s, would pass the call's deadline)")
            elif code in RETRYABLE and delays and left > 0:
                delay = min(delays.pop(0), left)
                logger.warning("%s: %s (%s) after round %d of %d; next round in %.2fs", method,
                               code.name, details, made, budget.rounds, delay)
                await asyncio.sleep(delay)
                continue
            raise RewardCallError(method, code, details, attempts=made)

    def _overload_delay(self, pushback_s: float | None, n: int) -> float:
        """Sleep before resending an overloaded call: the server's hint, jittered by +-20 %
        (it jitters too), or without one full-jitter exponential backoff."""
        if pushback_s is not None:
            return pushback_s * self._rng.uniform(0.8, 1.2)
        b = self.retry
        return self._rng.uniform(0.0, min(b.backoff_cap_s, b.backoff_initial_s * 2 ** min(n, 16)))

    def _unreachable(self) -> bool:
        state = self._channel.get_state(try_to_connect=False)
        return state is not grpc.ChannelConnectivity.READY

    async def _why_unreachable(
        self, method: str, request: Any, timeout_s: float
    ) -> tuple[grpc.StatusCode, str]:
        """The deadline passed while the server was away. Ask once more, fail-fast and without
        gRPC retries, on a fresh channel, so the error is what the connection attempt sees
        (e.g. ``Connection refused``) instead of a bare DEADLINE_EXCEEDED."""
        waited = f"server at {self.target} unreachable until the call's deadline"
        probe = self._open(self.target, [("grpc.enable_retries", 0)])
        try:
            stub = pb_grpc.RewardServiceStub(probe)  # type: ignore[no-untyped-call]
            await getattr(stub, method)(request, timeout=max(timeout_s, 0.5),
                                        metadata=self._metadata, wait_for_ready=False)
        except grpc.aio.AioRpcError as e:
            if e.code() is grpc.StatusCode.UNAVAILABLE:
                return e.code(), f"{waited}: {e.details() or ''}"
            return grpc.StatusCode.DEADLINE_EXCEEDED, waited
        finally:
            await probe.close(grace=None)
        # it answered just now: the server is back, but this call's deadline has passed
        return grpc.StatusCode.DEADLINE_EXCEEDED, f"{waited} (it answered again just after)"

    async def score(
        self, items: Sequence[d.ScoreItem], *, timeout_s: float | None = None
    ) -> list[d.ItemResult]:
        if self._coalescer is None:
            return await self._score_now(items, timeout_s)
        budget_s = timeout_s or self.retry.deadline_s
        try:  # the merged call may run to a later caller's deadline: this caller stops at its own
            return await asyncio.wait_for(
                self._coalescer.score(items, time.monotonic() + budget_s), budget_s + _MERGED_GRACE_S)
        except TimeoutError:
            raise RewardCallError("Score", grpc.StatusCode.DEADLINE_EXCEEDED,
                                  f"no answer within the call's deadline ({budget_s:g} s); it was "
                                  "merged with concurrent calls (coalesce)", attempts=1) from None

    async def _score_now(
        self, items: Sequence[d.ScoreItem], timeout_s: float | None
    ) -> list[d.ItemResult]:
        request = pb.ScoreRequest(items=[convert.item_to_proto(i) for i in items])
        response = await self._call("Score", self._stub.Score, request, timeout_s)
        return [convert.result_from_proto(r) for r in response.results]

    async def induce_rubrics(
        self,
        history: Sequence[d.HistoryItem],
        *,
        task: d.Task = d.Task.GENERIC,
        num_samples: int = 0,
        seed: int = 0,
        timeout_s: float | None = None,
    ) -> d.InductionResult:
        request = pb.InduceRubricsRequest(
            history=[pb.HistoryItem(context=h.context, text=h.text) for h in history],
            task=convert.task_to_proto(task),
            num_samples=num_samples,
            seed=seed,
        )
        response = await self._call("InduceRubrics", self._stub.InduceRubrics, request, timeout_s)
        return convert.induction_from_proto(response)

    async def verify(
        self,
        *,
        response: str,
        answer: str,
        preference: str,
        evidence: bool = False,
        timeout_s: float | None = None,
    ) -> d.Verification:
        request = pb.VerifyRequest(
            response=response, answer=answer, preference=preference, evidence=evidence
        )
        reply = await self._call("Verify", self._stub.Verify, request, timeout_s)
        return convert.verification_from_proto(reply)

    async def info(self, *, timeout_s: float | None = None) -> d.ServerInfo:
        reply = await self._call("Info", self._stub.Info, pb.InfoRequest(), timeout_s)
        return convert.info_from_proto(reply)

    async def health(self, service: str = "", *, timeout_s: float = 5.0) -> str:
        """grpc.health.v1 status name (SERVING, NOT_SERVING, ...); needs grpcio-health-checking.
        A probe: no waiting for an unreachable server and no retry (UNAVAILABLE at once)."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(self._channel)
        reply = await self._call(
            "Health.Check", stub.Check, health_pb2.HealthCheckRequest(service=service), timeout_s,
            wait_for_ready=False, rounds=1,
        )
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
