"""Prometheus metrics of one reward-server process (the gRPC ingress and its engine adapters).

Every metric has a fixed, small label set (no per-user or per-item labels), so cardinality is
bounded. The rpc layer calls :func:`observe_call` and :func:`observe_items`; the Ray adapters
call :func:`observe_engine_call` and :func:`track_in_flight`; batchers call
:func:`observe_batch`. :func:`start_metrics_server` exposes them on ``/metrics``.

Ray Serve replicas live in other processes: the batch sizes they form are exported through
Ray's own metrics pipeline (``ray.serve.metrics``, scraped from each Ray node's metrics export
port) as ``reward_server_replica_batch_items``; Serve's built-in ``ray_serve_*`` metrics
(replica counts, queue lengths, handle latencies) come the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server

logger = logging.getLogger(__name__)

_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)

RPC_CALLS = Counter(
    "reward_server_rpc_calls_total", "gRPC calls finished, by method and status code.",
    ("rpc", "code"),
)
RPC_LATENCY = Histogram(
    "reward_server_rpc_latency_seconds", "gRPC call latency, by method and status code.",
    ("rpc", "code"), buckets=_LATENCY_BUCKETS,
)
ITEMS = Counter(
    "reward_server_items_total", "Scored items, by reward kind and item status.",
    ("kind", "status"),
)
BATCH_ITEMS = Histogram(
    "reward_server_batch_items", "Items per engine batch formed in this process.",
    ("deployment",), buckets=_BATCH_BUCKETS,
)
ENGINE_CALLS = Counter(
    "reward_server_engine_calls_total",
    "Calls from this process to engine deployments, by outcome "
    "(ok, overloaded, unavailable, retried, error).",
    ("deployment", "method", "outcome"),
)
ENGINE_LATENCY = Histogram(
    "reward_server_engine_call_latency_seconds",
    "Latency of one call to an engine deployment (queueing + batching + engine).",
    ("deployment", "method"), buckets=_LATENCY_BUCKETS,
)
IN_FLIGHT = Gauge(
    "reward_server_engine_in_flight", "Calls to engine deployments waiting for an answer "
    "(this process's queue depth towards each deployment).", ("deployment",),
)
ADMITTED = Gauge(
    "reward_server_admitted", "Work admitted now (service.admission): judgments (judge prompts "
    "plus NLI pairs) and request bytes.", ("unit",),
)
LIMITS = Gauge(
    "reward_server_admission_limit", "Admission limits in force now (service.admission, sized "
    "from the measured throughput when adaptive): judgments and calls.", ("unit",),
)
REFUSED = Counter(
    "reward_server_admission_refused_total", "Calls refused by admission control "
    "(RESOURCE_EXHAUSTED), by the limit that was full and when (before_read: before the request "
    "was read; after_parse: once its size was known).", ("limit", "stage"),
)


def observe_call(rpc: str, code: str, seconds: float) -> None:
    """One finished gRPC call: ``rpc`` is the method name (Score, Verify, ...), ``code`` the
    gRPC status code name (OK, RESOURCE_EXHAUSTED, ...)."""
    RPC_CALLS.labels(rpc, code).inc()
    RPC_LATENCY.labels(rpc, code).observe(seconds)


def observe_items(kind: str, status: str, n: int = 1) -> None:
    """``n`` items of reward ``kind`` (rubric_score, parl_reward, ...) ended with ``status``."""
    if n > 0:
        ITEMS.labels(kind, status).inc(n)


def observe_batch(deployment: str, size: int) -> None:
    """One engine batch of ``size`` items was formed for ``deployment`` (judge, nli)."""
    BATCH_ITEMS.labels(deployment).observe(size)


def observe_engine_call(deployment: str, method: str, outcome: str, seconds: float) -> None:
    """One call to an engine deployment finished with ``outcome``."""
    ENGINE_CALLS.labels(deployment, method, outcome).inc()
    if outcome == "ok":
        ENGINE_LATENCY.labels(deployment, method).observe(seconds)


def set_admitted(judgments: int, nbytes: int) -> None:
    """The work admission control holds now."""
    ADMITTED.labels("judgments").set(judgments)
    ADMITTED.labels("bytes").set(nbytes)


def set_admission_limits(judgments: int | None, calls: int | None) -> None:
    """The admission limits in force now (None: unlimited, not set)."""
    if judgments is not None:
        LIMITS.labels("judgments").set(judgments)
    if calls is not None:
        LIMITS.labels("calls").set(calls)


def observe_refusal(limit: str, stage: str) -> None:
    """One call refused at ``stage`` because the ``limit`` (judgments, bytes) was full."""
    REFUSED.labels(limit, stage).inc()


@contextmanager
def track_in_flight(deployment: str) -> Iterator[None]:
    """Count a call towards ``deployment`` as in flight while the block runs."""
    gauge = IN_FLIGHT.labels(deployment)
    gauge.inc()
    try:
        yield
    finally:
        gauge.dec()


def start_metrics_server(port: int, *, addr: str = "127.0.0.1") -> int:
    """Serve ``/metrics`` (Prometheus text format) on ``addr:port`` from a daemon thread.

    ``port=0`` picks a free port. Returns the port bound.
    """
    server, _thread = start_http_server(port, addr=addr, registry=REGISTRY)
    bound = int(server.server_port)
    logger.info("Prometheus metrics on http://%s:%d/metrics", addr, bound)
    return bound
