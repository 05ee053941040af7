"""reward.v1.RewardService over a :class:`~reward_server.rpc.backend.Backend`: the reward
service in this process, or the service replicas a forwarding ingress sends each call to.

Each method is registered with gRPC as request-streaming and without a request deserializer
(:meth:`RewardServicer.handlers`). On the wire and in reflection the methods stay unary and
clients see no difference, but the handler starts when a call's headers arrive (after the auth
interceptor) instead of after its body, so that a call is:

1. refused at once, before its body is read, when the server is draining (UNAVAILABLE) or
   admission control has no room for a call of the usual size (RESOURCE_EXHAUSTED with
   ``grpc-retry-pushback-ms``);
2. given ``server.receive_timeout_s`` for its one request message (half-open calls end);
3. parsed here (:mod:`reward_server.api.wire`): a malformed body is INVALID_ARGUMENT, a large
   Score request is parsed and converted item by item;
4. admitted by size, then by judgments (:mod:`reward_server.service.admission`), then run under the
   client's deadline (or ``server.default_timeout_s``); every exception goes through the one
   status table (:mod:`reward_server.rpc.status`).

Steps 1 and 4 (with the metrics, logs and the call's tracing span) are :meth:`RewardServicer.call`,
which the HTTP/JSON door (:mod:`reward_server.rpc.http`) runs too: both transports share the
gate, the count of calls in flight, admission and the backend's work of each method.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import operator
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from reward_server import metrics, tracing
from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server.errors import BackendUnavailable, DeadlineExceeded, InvalidRequest, Overloaded
from reward_server.rpc.backend import Backend, CallState, Reply
from reward_server.rpc.grpc_metrics import when_done
from reward_server.rpc.memory import Trimmer
from reward_server.rpc.refusals import LoadRefusalLog
from reward_server.rpc.settings import ServerSettings
from reward_server.rpc.status import message_for, status_for, trailers_for
from reward_server.rpc.unsent import UnsentResponses

logger = logging.getLogger(__name__)
T = TypeVar("T")
Context = grpc.aio.ServicerContext[Any, Any]
Requests = AsyncIterator[bytes]


_serialize: Callable[[Reply], bytes] = operator.methodcaller("SerializeToString")
ATTEMPTS_KEYS = ("grpc-previous-rpc-attempts", "reward-previous-attempts")


def _previous_attempts(context: Context) -> int:
    """How often the client tried this call before: gRPC's ``grpc-previous-rpc-attempts``
    (set by gRPC's own retries; applications cannot set it), or ``reward-previous-attempts``
    (a client retrying by itself, past gRPC's 5 attempts); the larger, 0 when absent."""
    attempts = 0
    for key, value in context.invocation_metadata() or ():
        if key in ATTEMPTS_KEYS:
            with contextlib.suppress(ValueError, TypeError):
                attempts = max(attempts, min(int(value), 1000))
    return attempts


class RewardServicer:
    """The four methods over ``backend``, the draining gate, and the count of calls in flight."""

    def __init__(
        self,
        backend: Backend,
        settings: ServerSettings,
        *,
        on_engine_failure: Callable[[], None] | None = None,
    ) -> None:
        self.backend = backend
        self._admission = backend.admission
        self._settings = settings
        self._on_engine_failure = on_engine_failure
        self._accepting = True
        self._released = asyncio.Event()
        self.last_arrival = time.monotonic()
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.unsent = UnsentResponses(
            per_connection=settings.max_unsent_response_bytes_per_connection,
            total=settings.max_unsent_response_bytes,
        )
        self.trimmer = Trimmer(busy=lambda: self._active > 0)
        self._refusals = LoadRefusalLog()

    def handlers(self) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
        def handler(fn: Callable[[Requests, Context], Awaitable[Any]]) -> grpc.RpcMethodHandler[Any, Any]:
            return grpc.stream_unary_rpc_method_handler(
                fn, request_deserializer=None, response_serializer=_serialize
            )

        return {"Score": handler(self.Score), "InduceRubrics": handler(self.InduceRubrics),
                "Verify": handler(self.Verify), "Info": handler(self.Info)}

    def as_message(self, rpc: str, reply: Reply) -> Message:
        """``reply`` of method ``rpc`` as its response message (the HTTP door's JSON)."""
        return self.backend.as_message(rpc, reply)

    # ------------------------------------------------------------------ drain
    @property
    def active(self) -> int:
        """Calls past the gate and not finished."""
        return self._active

    def stop_accepting(self) -> None:
        """From now on new calls wait for :meth:`release_parked`, then get UNAVAILABLE; calls
        in flight go on. (Answering them at once would let a client resend at once, and a call
        that reaches gRPC just as its port closes is cancelled, not answered.)"""
        self._accepting = False

    def release_parked(self) -> None:
        """The port is closed: answer the parked calls UNAVAILABLE."""
        self._released.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Until no call is in flight (True) or ``timeout_s`` passed (False)."""
        try:
            await asyncio.wait_for(self._idle.wait(), max(0.0, timeout_s))
        except TimeoutError:
            return False
        return True

    async def _refuse_draining(self, context: Context) -> None:
        remaining = context.time_remaining()
        wait = self._settings.grace_period_s if remaining is None else max(0.0, remaining - 0.05)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._released.wait(), wait)

    # ------------------------------------------------------------------- calls
    async def _receive(self, requests: Requests) -> bytes:
        limit = self._settings.receive_timeout_s
        try:
            return await asyncio.wait_for(anext(requests), limit)
        except TimeoutError:
            raise DeadlineExceeded(
                f"the request message did not arrive within server.receive_timeout_s={limit}s "
                "of the call's headers"
            ) from None
        except StopAsyncIteration:
            raise InvalidRequest("the call carried no request message") from None

    def _check_size(self, rpc: str, raw: bytes) -> None:
        cap = self.backend.max_request_bytes[rpc]
        if len(raw) > cap:
            raise InvalidRequest(
                f"the request has {len(raw)} bytes, more than any valid reward.v1.{rpc} request "
                f"under service.limits ({cap}); check the sizes of its texts"
            )

    async def call(
        self,
        rpc: str,
        receive: Callable[[], Awaitable[bytes]],
        *,
        time_remaining: Callable[[], float | None],
        transport: str,
        park: Callable[[], Awaitable[None]] | None = None,
        attempts: int = 0,
    ) -> Reply:
        """Method ``rpc`` of any transport: the draining gate, admission, the deadline
        (``time_remaining()`` seconds, None: ``server.default_timeout_s``), the request
        (``receive()``: its serialized message), the work, metrics, logs and the call's span.
        Raises what went wrong; the transport maps it with :mod:`reward_server.rpc.status`.
        ``park``: awaited before a call that arrives while draining is refused; ``attempts``:
        the client's previous attempts of this call (retried work goes first, see
        :meth:`Admission.arrive`)."""
        admit = self.backend.judged[rpc]
        self.last_arrival = time.monotonic()
        start = time.perf_counter()
        code_name = "OK"
        entered = False
        received = 0
        with tracing.span(f"reward.v1/{rpc}", transport=transport) as current:
            try:
                if not self._accepting:
                    if park is not None:
                        await park()
                    raise BackendUnavailable(
                        "the server is shutting down (draining); retry on another replica"
                    )
                entered = True
                self._active += 1
                self._idle.clear()
                remaining = time_remaining()
                timeout = (self._settings.default_timeout_s if remaining is None
                           else max(0.0, remaining))
                admission = self._admission
                try:
                    async with asyncio.timeout(timeout) as deadline:
                        # refused here when full (Info holds a call, no judgments): nothing read
                        with await admission.arrive(judged=admit, attempts=attempts,
                                                    deadline=deadline.when()) as ticket:
                            raw = await receive()
                            received = len(raw)
                            self._check_size(rpc, raw)
                            ticket.add_bytes(len(raw))
                            state = CallState(current, deadline.when() or 0.0, attempts,
                                              time_remaining)
                            return await self.backend.run(rpc, raw, ticket, state)
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        raise  # the call itself was cancelled (client gone, server stopping)
                    # a cancellation leaked out of an engine: an infrastructure failure
                    raise BackendUnavailable(
                        "an engine call was cancelled before it answered; retry the call"
                    ) from None
            except asyncio.CancelledError:  # the client went away (or reset the call)
                code_name = "CANCELLED"
                raise
            except Exception as exc:  # mapped to a status by the transport; never a reward
                code = status_for(exc)
                code_name = code.name
                if code is grpc.StatusCode.INTERNAL:
                    logger.exception("%s failed with an unexpected error", rpc)
                elif isinstance(exc, Overloaded):
                    self._refusals.refused(rpc, message_for(exc))
                else:
                    logger.info("%s -> %s: %s", rpc, code.name, message_for(exc))
                if (isinstance(exc, BackendUnavailable) and entered
                        and self._on_engine_failure is not None):
                    self._on_engine_failure()  # let health look at the engines now
                raise
            finally:
                tracing.set_attribute(current, "code", code_name)
                self.trimmer.freed(received)
                if entered:
                    self._active -= 1
                    if not self._active:
                        self._idle.set()
                        self.trimmer.idle()
                seconds = time.perf_counter() - start
                metrics.observe_call(rpc, code_name, seconds, transport=transport)
                logger.debug("%s took %.1f ms", rpc, seconds * 1000)

    def _refusal(self, rpc: str, context: Context, attempts: int) -> Overloaded | None:
        """Admission's refusal of a call arriving now, before anything else is done for it
        (the cheapest path: a refusal comes when the server has no time to spare), counted
        and logged as :meth:`call` would; None when the call goes on."""
        if not self._accepting:
            return None
        remaining = context.time_remaining()
        deadline = asyncio.get_running_loop().time() + (
            self._settings.default_timeout_s if remaining is None else max(0.0, remaining))
        refused = self._admission.refusal(judged=self.backend.judged[rpc], attempts=attempts,
                                          deadline=deadline)
        if refused is not None:
            self._refusals.refused(rpc, message_for(refused))
            metrics.observe_call(rpc, "RESOURCE_EXHAUSTED", 0.0, transport="grpc")
        return refused

    async def _run(self, rpc: str, requests: Requests, context: Context) -> Any:
        attempts = _previous_attempts(context)
        if (refused := self._refusal(rpc, context, attempts)) is not None:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message_for(refused),
                                trailing_metadata=trailers_for(refused))
        peer = context.peer()
        try:
            self.unsent.enter(peer)  # refused while this connection does not read
            try:
                response = await self.call(
                    rpc, lambda: self._receive(requests), time_remaining=context.time_remaining,
                    transport="grpc", park=lambda: self._refuse_draining(context),
                    attempts=attempts,
                )
                nbytes = response.ByteSize()
                self.unsent.hold(peer, nbytes)  # until gRPC has written it (or the call ends)
            finally:
                self.unsent.leave(peer)
            when_done(context, lambda: self._sent(peer, nbytes))
            return response
        except Exception as exc:
            # gRPC keeps the abort's exception, whose context is ``exc``, in the call's state
            # after the call (seen held until later calls replaced it); its traceback's frames
            # hold the request (52 MB of a refused body stayed in RSS): drop them (logged already)
            exc.__traceback__ = None
            await context.abort(status_for(exc), message_for(exc),
                                trailing_metadata=trailers_for(exc))
            raise  # unreachable: abort raises

    def _sent(self, peer: str, nbytes: int) -> None:
        self.unsent.release(peer, nbytes)
        self.trimmer.freed(nbytes)

    async def Score(self, requests: Requests, context: Context) -> pb.ScoreResponse:
        return await self._run("Score", requests, context)  # type: ignore[no-any-return]

    async def InduceRubrics(self, requests: Requests, context: Context) -> pb.InduceRubricsResponse:
        return await self._run("InduceRubrics", requests, context)  # type: ignore[no-any-return]

    async def Verify(self, requests: Requests, context: Context) -> pb.VerifyResponse:
        return await self._run("Verify", requests, context)  # type: ignore[no-any-return]

    async def Info(self, requests: Requests, context: Context) -> pb.InfoResponse:
        return await self._run("Info", requests, context)  # type: ignore[no-any-return]
