"""gRPC's standard server metrics (gRFC A66), recorded by a grpc.aio server interceptor and
exported with OpenTelemetry's SDK and Prometheus exporter into the process's Prometheus registry
(:func:`reward_server.metrics.exposition`).

The instruments, attributes and bucket boundaries are the ones gRFC A66 defines and gRPC's own
OpenTelemetry plugins (C++, Java, Go, ``grpcio-observability``) emit, so dashboards made for
gRPC's metrics read them unchanged::

    grpc.server.call.started                           counter    {grpc.method}
    grpc.server.call.duration                          histogram  {grpc.method, grpc.status}  s
    grpc.server.call.rcvd_total_compressed_message_size  histogram  ...                     By
    grpc.server.call.sent_total_compressed_message_size  histogram  ...                     By

In Prometheus' text format these are ``grpc_server_call_started_total``,
``grpc_server_call_duration_seconds``, ``grpc_server_call_rcvd_total_compressed_message_size_bytes``
and ``grpc_server_call_sent_total_compressed_message_size_bytes`` with the labels
``grpc_method`` and ``grpc_status``. ``grpcio-observability`` itself is not used: each of its
releases requires exactly its own grpcio version (1.85.0 for grpcio 1.85.1 here, which pip
cannot resolve). Every method with a handler is counted (health, reflection, reward.v1; a call
refused by the token check too); calls to unknown methods are answered UNIMPLEMENTED by gRPC and
not counted, so the ``grpc_method`` values are bounded. The server sets no compression, so the
sizes are the serialized message sizes. Only gRPC calls are counted here; the HTTP/JSON door's
calls are in ``reward_server_rpc_calls_total{transport="http"}``.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

if TYPE_CHECKING:
    _Interceptor = grpc.aio.ServerInterceptor[Any, Any]
else:  # the runtime class is not generic
    _Interceptor = grpc.aio.ServerInterceptor

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
METER_NAME = "grpc-python"


class _Instruments:
    """The four A66 server instruments on one meter provider, exported to Prometheus."""

    def __init__(self) -> None:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from opentelemetry.sdk.metrics import MeterProvider

        # registers itself with prometheus_client's default registry (once per process)
        self.provider = MeterProvider(metric_readers=[PrometheusMetricReader(disable_target_info=True)])
        meter = self.provider.get_meter(METER_NAME, grpc.__version__)
        self.started = meter.create_counter(
            "grpc.server.call.started", unit="{call}",
            description="The total number of calls started, including those not yet completed.",
        )
        self.duration = meter.create_histogram(
            "grpc.server.call.duration", unit="s",
            description="End-to-end time taken to complete a call from the server's view.",
            explicit_bucket_boundaries_advisory=LATENCY_BOUNDARIES,
        )
        self.rcvd = meter.create_histogram(
            "grpc.server.call.rcvd_total_compressed_message_size", unit="By",
            description="Total bytes (compressed, not framed) received across all request "
            "messages of a call.", explicit_bucket_boundaries_advisory=SIZE_BOUNDARIES,
        )
        self.sent = meter.create_histogram(
            "grpc.server.call.sent_total_compressed_message_size", unit="By",
            description="Total bytes (compressed, not framed) sent across all response "
            "messages of a call.", explicit_bucket_boundaries_advisory=SIZE_BOUNDARIES,
        )


_instruments: _Instruments | None = None
_lock = threading.Lock()


def instruments() -> _Instruments:
    """The process's instruments (one exporter per process: Prometheus has one registry)."""
    global _instruments
    with _lock:
        if _instruments is None:
            _instruments = _Instruments()
        return _instruments


class _Call:
    """One call's measurements; recorded when gRPC reports the call done."""

    __slots__ = ("attrs", "instruments", "rcvd", "sent", "start", "status")

    def __init__(self, instruments: _Instruments, method: str) -> None:
        self.instruments = instruments
        self.attrs = {"grpc.method": method}
        self.start = time.perf_counter()
        self.rcvd = 0
        self.sent = 0
        self.status: str | None = None  # what the handler's own end says, when gRPC's code does not
        instruments.started.add(1, self.attrs)

    def deserializer(self, inner: Callable[[bytes], Any] | None) -> Callable[[bytes], Any]:
        def deserialize(raw: bytes) -> Any:
            self.rcvd += len(raw)
            return raw if inner is None else inner(raw)

        return deserialize

    def serializer(self, inner: Callable[[Any], bytes] | None) -> Callable[[Any], bytes]:
        def serialize(message: Any) -> bytes:
            raw = message if inner is None else inner(message)
            self.sent += len(raw)
            return bytes(raw)

        return serialize

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
        attrs = {**self.attrs, "grpc.status": status}
        i = self.instruments
        i.duration.record(time.perf_counter() - self.start, attrs)
        i.rcvd.record(self.rcvd, attrs)
        i.sent.record(self.sent, attrs)


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


def _watched(behavior: Callable[..., Any], call: _Call) -> Callable[..., Any]:
    """``behavior`` (a coroutine, async generator or plain function of (request, context))
    that first asks gRPC to report the call's end to ``call``."""

    def watch(context: grpc.aio.ServicerContext[Any, Any]) -> None:
        when_done(context, lambda: call.done(context))

    if inspect.isasyncgenfunction(behavior):
        async def stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            watch(context)
            try:
                async for response in behavior(request, context):
                    yield response
            except BaseException as exc:
                call.ended(exc, context)
                raise

        return stream
    if inspect.iscoroutinefunction(behavior):
        async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            watch(context)
            try:
                return await behavior(request, context)
            except BaseException as exc:
                call.ended(exc, context)
                # gRPC keeps the exception a handler raised in the call's state after the call;
                # the frames of its traceback hold the request iterator, whose suspended
                # generator holds the last message (each refused 16 MB body stayed in RSS):
                # keep neither (the servicer has logged what it needed)
                del request
                raise exc.with_traceback(None)  # noqa: B904 - the same exception, re-raised

        return unary

    def plain(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        watch(context)
        try:
            return behavior(request, context)
        except BaseException as exc:
            call.ended(exc, context)
            raise

    return plain


_BEHAVIORS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


class GrpcMetricsInterceptor(_Interceptor):
    """Records gRFC A66's server metrics for every call that has a handler; place it first so
    that calls the later interceptors refuse are counted too."""

    def __init__(self) -> None:
        self._instruments = instruments()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler: Any = await continuation(handler_call_details)
        if handler is None:  # no such method: gRPC answers UNIMPLEMENTED
            return handler  # type: ignore[return-value]
        call = _Call(self._instruments, (handler_call_details.method or "").lstrip("/"))
        changes: dict[str, Any] = {
            "request_deserializer": call.deserializer(handler.request_deserializer),
            "response_serializer": call.serializer(handler.response_serializer),
        }
        for name in _BEHAVIORS:
            behavior = getattr(handler, name)
            if behavior is not None:
                changes[name] = _watched(behavior, call)
        return handler._replace(**changes)  # type: ignore[no-any-return]
