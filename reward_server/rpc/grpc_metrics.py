"""gRPC's standard server metrics (gRFC A66), recorded by each handler the server registers
(wrapped once, when it is registered: :func:`register`), into the process's Prometheus registry
(:func:`reward_server.metrics.exposition`).

The instruments, attributes and bucket boundaries are the ones gRFC A66 defines and gRPC's own
OpenTelemetry plugins (C++, Java, Go, ``grpcio-observability``) emit, under the names their
Prometheus export gives them, so dashboards made for gRPC's metrics read them unchanged::

    grpc_server_call_started_total                              counter    {grpc_method}
    grpc_server_call_duration_seconds                           histogram  {grpc_method, grpc_status}
    grpc_server_call_rcvd_total_compressed_message_size_bytes   histogram  {grpc_method, grpc_status}
    grpc_server_call_sent_total_compressed_message_size_bytes   histogram  {grpc_method, grpc_status}

Every method the server registers is counted (health, reflection, reward.v1; a call refused by
the token check too); calls to unknown methods are answered UNIMPLEMENTED by gRPC and not
counted, so the ``grpc_method`` values are bounded. The server sets no compression, so the sizes
are the serialized message sizes. Only gRPC calls are counted here; the HTTP/JSON door's calls are
in ``reward_server_rpc_calls_total{transport="http"}``.

Wrapped handlers and prometheus_client, not a server interceptor and OpenTelemetry's SDK (as
before; ``grpcio-observability`` itself requires exactly its own grpcio version): both ran on
every call, a refused one too, and a refusal for load must cost the server little, as it comes
when the server has no time to spare. On a burst of 512 calls refused at once the interceptor
alone added about a quarter to a bare grpc.aio server's refusal latency, and the SDK's four
records took ~34 us a call (bench/refusal_cost.py); here a call costs a dict lookup and four
prometheus_client updates. The bearer-token check (:class:`~reward_server.rpc.auth.TokenCheck`)
runs in the same wrapper, first.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import grpc
from prometheus_client import Counter, Histogram

from reward_server.metrics import observe_call
from reward_server.rpc.auth import TokenCheck
from reward_server.rpc.connections import ConnectionGuard
from reward_server.rpc.sockscan import Conn, peer_of

# gRFC A66's recommended boundaries
LATENCY_BOUNDARIES = (
    0, 0.00001, 0.00005, 0.0001, 0.0003, 0.0006, 0.0008, 0.001, 0.002, 0.003, 0.004, 0.005,
    0.006, 0.008, 0.01, 0.013, 0.016, 0.02, 0.025, 0.03, 0.04, 0.05, 0.065, 0.08, 0.1, 0.13, 0.16,
    0.2, 0.25, 0.3, 0.4, 0.5, 0.65, 0.8, 1, 2, 5, 10, 20, 50, 100,
)
SIZE_BOUNDARIES = (
    0, 1024, 2048, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864, 268435456,
    1073741824, 4294967296,
)
STARTED = Counter(
    "grpc_server_call_started", "The total number of calls started, including those not yet "
    "completed.", ("grpc_method",),
)
DURATION = Histogram(
    "grpc_server_call_duration_seconds", "End-to-end time taken to complete a call from the "
    "server's view.", ("grpc_method", "grpc_status"), buckets=LATENCY_BOUNDARIES,
)
RCVD = Histogram(
    "grpc_server_call_rcvd_total_compressed_message_size_bytes", "Total bytes (compressed, not "
    "framed) received across all request messages of a call.", ("grpc_method", "grpc_status"),
    buckets=SIZE_BOUNDARIES,
)
SENT = Histogram(
    "grpc_server_call_sent_total_compressed_message_size_bytes", "Total bytes (compressed, not "
    "framed) sent across all response messages of a call.", ("grpc_method", "grpc_status"),
    buckets=SIZE_BOUNDARIES,
)
_BEHAVIORS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
_CALL: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("grpc_metrics_call",
                                                                    default=None)


class _Method:
    """One method's metric children, looked up once per status."""

    __slots__ = ("_ended", "name", "started")

    def __init__(self, name: str) -> None:
        self.name = name
        self.started = STARTED.labels(name)
        self._ended: dict[str, tuple[Any, Any, Any]] = {}

    def ended(self, status: str, seconds: float, rcvd: int, sent: int) -> None:
        children = self._ended.get(status)
        if children is None:
            children = self._ended[status] = (DURATION.labels(self.name, status),
                                              RCVD.labels(self.name, status),
                                              SENT.labels(self.name, status))
        children[0].observe(seconds)
        children[1].observe(rcvd)
        children[2].observe(sent)


class _Call:
    """One call's measurements; recorded when gRPC reports the call done."""

    __slots__ = ("conn", "guard", "method", "rcvd", "sent", "start", "status", "waiting")

    def __init__(self, method: _Method, guard: ConnectionGuard | None) -> None:
        self.method = method
        self.start = time.perf_counter()
        self.rcvd = 0
        self.sent = 0
        self.status: str | None = None  # what the handler's own end says, when gRPC's code does not
        self.guard = guard
        self.conn: Conn | None = None  # with a guard: the connection
        self.waiting = False  # counted by the guard as waiting for its request
        method.started.inc()

    def message(self, nbytes: int) -> None:
        self.rcvd += nbytes
        if self.guard is not None:
            self.guard.received(self.conn, nbytes, first=self.waiting)
            self.waiting = False

    def reading(self) -> None:
        """The handler asks for a request message (the first time, with none in yet: the
        guard counts the call as waiting for its request until one arrives)."""
        if self.guard is not None and not self.waiting and not self.rcvd:
            self.waiting = True
            self.guard.reading(self.conn)

    def ended(self, exc: BaseException, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """The handler ended with ``exc``: an abort sets its code on the context; a cancelled
        handler is CANCELLED (DEADLINE_EXCEEDED when the deadline passed); anything else is
        UNKNOWN, as gRPC answers it."""
        if isinstance(exc, grpc.aio.AbortError):
            return
        if isinstance(exc, asyncio.CancelledError | GeneratorExit):  # GeneratorExit: a stream closed
            remaining = context.time_remaining()
            self.status = ("DEADLINE_EXCEEDED" if remaining is not None and remaining <= 0
                           else "CANCELLED")
        else:
            self.status = "UNKNOWN"

    def done(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        code = context.code()
        if code is not None:
            status = code.name if isinstance(code, grpc.StatusCode) else str(code)
        else:
            status = self.status or "OK"
        self.method.ended(status, time.perf_counter() - self.start, self.rcvd, self.sent)
        if self.guard is not None:  # cancelled with no request: reset by its client (or gone)
            self.guard.ended(self.conn, waiting=self.waiting,
                             reset_early=status == "CANCELLED" and not self.rcvd)


def _size(message: Any) -> int:
    return len(message) if isinstance(message, bytes | bytearray) else int(message.ByteSize())


def _deserializer(inner: Callable[[bytes], Any] | None) -> Callable[[bytes], Any]:
    """A streamed request's deserializer that counts each message (it runs in the call's task,
    as the handler reads: a unary request is deserialized before, and counted by the handler)."""
    def deserialize(raw: bytes) -> Any:
        call = _CALL.get()
        if call is not None:
            call.message(len(raw))
        return raw if inner is None else inner(raw)

    return deserialize


def _serializer(inner: Callable[[Any], bytes] | None) -> Callable[[Any], bytes]:
    """A response serializer that counts each message (returned, yielded or written)."""
    def serialize(message: Any) -> bytes:
        raw = message if inner is None else inner(message)
        call = _CALL.get()
        if call is not None:
            call.sent += len(raw)
        return bytes(raw)

    return serialize


def when_done(context: grpc.aio.ServicerContext[Any, Any], fn: Callable[[], object]) -> None:
    """Call ``fn`` when gRPC is done with the call of ``context`` (its answer written, or the
    call ended otherwise); from inside that call's handler.

    Not ``context.add_done_callback``: gRPC keeps such a callback, bound to the context, in the
    call's state, which the context refers to, and never drops it: one reference cycle per
    call, with the call's state and gRPC's copy of its metadata, that only the cyclic collector
    frees. The serving thresholds (:data:`reward_server.app.SERVER_GC_THRESHOLDS`) collect
    rarely, and calls in flight during a young collection are promoted, so after a burst of
    calls their states piled up until a full collection, and the memory they had spread over
    stayed with the process. The handler runs in the task gRPC created for the call
    (grpc.aio's ``_schedule_rpc_coro``), which runs the context's done callbacks when it
    finishes; a callback on that task runs at the same moment, and asyncio drops a task's
    callbacks once they ran. 1,024 concurrent 1-item calls (bench/faults.py's G) on a fresh
    server: RSS 70 -> 72 MB after them, against 71 -> 85 before.

    gRPC's request iterator makes a second cycle (the async generator it starts refers back to
    it). Reading the request with ``context.read()`` instead avoided it, but then the three
    16 MiB bodies of faults.py's A stayed resident (69 -> 84-92 MB, free in glibc's per-thread
    arenas, which ``malloc_trim`` did not return) where through the iterator they did not
    (69 -> 69-70), so the iterator stays."""
    task = asyncio.current_task()
    assert task is not None, "when_done is called from a gRPC handler, which runs in a task"
    task.add_done_callback(lambda _t: fn())


def _authorized(context: grpc.aio.ServicerContext[Any, Any], check: TokenCheck) -> str | None:
    """None when the call carries the token, else what is wrong with it."""
    presented = b""
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            presented = value.encode() if isinstance(value, str) else bytes(value)
    return check.problem(presented)


def _wrap(behavior: Callable[..., Any], method: _Method, kind: str, check: TokenCheck | None,
          guard: ConnectionGuard | None) -> Callable[..., Any]:
    """``behavior`` (of gRPC handler ``kind``) that counts its call and, with ``check``, first
    refuses one without the token (UNAUTHENTICATED, before its request is read); with
    ``guard`` (streamed requests only), tells it of the call and its request."""
    if kind.startswith("unary_"):
        guard = None  # the request is in before the handler starts

    def start(context: grpc.aio.ServicerContext[Any, Any]) -> _Call:
        call = _Call(method, guard)
        if guard is not None:
            call.conn = peer_of(context.peer())
        _CALL.set(call)
        when_done(context, lambda: call.done(context))
        return call

    async def deny(context: grpc.aio.ServicerContext[Any, Any], call: _Call) -> None:
        if check is not None and (reason := _authorized(context, check)) is not None:
            # reward_server_rpc_calls_total too: the servicer, which counts calls, never sees it
            observe_call(method.name.rpartition("/")[2], "UNAUTHENTICATED", 0.0, transport="grpc")
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)
        if guard is not None and (refused := guard.started(call.conn)) is not None:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused)

    unary_request = kind.startswith("unary_")
    if not (inspect.iscoroutinefunction(behavior) or inspect.isasyncgenfunction(behavior)):
        if check is not None:  # the token check awaits an abort
            raise TypeError("a handler that checks the token must be async")

        def plain(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            call = start(context)  # a plain function (health's List)
            try:
                if unary_request:
                    call.rcvd += _size(request)
                return behavior(request, context)
            except BaseException as exc:
                call.ended(exc, context)
                raise

        return plain
    if inspect.isasyncgenfunction(behavior):  # response streams that yield (reflection)
        async def stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            call = start(context)
            try:
                await deny(context, call)
                if unary_request:
                    call.rcvd += _size(request)
                async for response in behavior(request, context):
                    yield response
            except BaseException as exc:
                call.ended(exc, context)
                raise

        return stream

    async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        call = start(context)
        try:
            if guard is not None and context.cancelled():  # reset before it was taken: no
                raise asyncio.CancelledError  # work for it (a rapid reset brings thousands)
            await deny(context, call)
            if unary_request:
                call.rcvd += _size(request)
            elif guard is not None:
                request = _Reading(request, call)
            return await behavior(request, context)
        except BaseException as exc:
            call.ended(exc, context)
            # gRPC keeps the exception a handler raised in the call's state after the call;
            # the frames of its traceback hold the request iterator, whose suspended generator
            # holds the last message (each refused 16 MB body stayed in RSS): keep neither
            # (the servicer has logged what it needed)
            del request
            raise exc.with_traceback(None)  # noqa: B904 - the same exception, re-raised

    return unary


class _Reading:
    """A call's request iterator that tells its call when the handler asks for a message
    (a class, not an async generator: that would add a reference cycle per call)."""

    __slots__ = ("_call", "_requests")

    def __init__(self, requests: AsyncIterator[Any], call: _Call) -> None:
        self._requests, self._call = requests, call

    def __aiter__(self) -> _Reading:
        return self

    async def __anext__(self) -> Any:
        self._call.reading()
        return await self._requests.__anext__()


def register(server: grpc.aio.Server, service: str,
             handlers: Mapping[str, grpc.RpcMethodHandler[Any, Any]], *,
             token: TokenCheck | None = None, guard: ConnectionGuard | None = None) -> None:
    """Serve ``service``'s ``handlers`` on ``server``, each counted (see the module doc),
    with ``token`` refusing calls that do not carry it, with ``guard`` telling it of each call
    (:mod:`reward_server.rpc.connections`)."""
    wrapped = {}
    for name, handler in handlers.items():
        method = _Method(f"{service}/{name}")
        kind = next(k for k in _BEHAVIORS if getattr(handler, k) is not None)
        changes = {kind: _wrap(getattr(handler, kind), method, kind, token, guard),
                   "response_serializer": _serializer(handler.response_serializer)}
        if not kind.startswith("unary_"):
            changes["request_deserializer"] = _deserializer(handler.request_deserializer)
        wrapped[name] = handler._replace(**changes)  # type: ignore[attr-defined]
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, wrapped),))
    server.add_registered_method_handlers(service, wrapped)  # type: ignore[attr-defined]


class Registrar:
    """What generated ``add_*Servicer_to_server`` functions call on a server, registering
    through :func:`register` (so their handlers are counted too)."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, generic_handlers: object) -> None:
        """Ignored: the same handlers arrive by name in :meth:`add_registered_method_handlers`."""

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        register(self._server, service, handlers)
