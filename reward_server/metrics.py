"""Prometheus metrics of one reward-server process (the gRPC ingress and its engine adapters).

Every metric has a fixed, small label set (no per-user or per-item labels), so cardinality is
bounded. The rpc layer calls :func:`observe_call` (per transport: ``grpc`` or ``http``) and
:func:`observe_item` / :func:`observe_failed_items`; the Ray adapters call
:func:`observe_engine_call` and :func:`track_in_flight`; batchers call :func:`observe_batch` and
:func:`observe_queue_wait`. :func:`exposition` renders them (with gRPC's standard server
metrics, :mod:`reward_server.rpc.grpc_metrics`, which export to the same registry) for the HTTP
door's ``GET /metrics``; :class:`MetricsServer` serves them on ``server.metrics_port``.
The names are listed in docs/metrics.md.

Ray Serve replicas live in other processes: the batch sizes they form are exported through
Ray's own metrics pipeline (``ray.serve.metrics``, scraped from each Ray node's metrics export
port) as ``reward_server_replica_batch_items``; Serve's built-in ``ray_serve_*`` metrics
(replica counts, queue lengths, handle latencies) come the same way.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    make_wsgi_app,
)
from prometheus_client.exposition import ThreadingWSGIServer

logger = logging.getLogger(__name__)

_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
# rewards: [0, 1] for rubric scores, [-1, 1] for PARL and NLICV rewards, penalties below
_REWARD_BUCKETS = tuple(round(-1.0 + 0.1 * i, 1) for i in range(21))
ITEM_FAILED = "failed"  # items of a Score call that failed: what a trainer masks

RPC_CALLS = Counter(
    "reward_server_rpc_calls_total", "reward.v1 calls finished, by method, status code and "
    "transport (grpc: the gRPC port; http: the HTTP/JSON door).",
    ("rpc", "code", "transport"),
)
RPC_LATENCY = Histogram(
    "reward_server_rpc_latency_seconds", "reward.v1 call latency, by method, status code and "
    "transport.", ("rpc", "code", "transport"), buckets=_LATENCY_BUCKETS,
)
ITEMS = Counter(
    "reward_server_items_total", "Score items, by reward kind and outcome: ok, policy_invalid "
    "(answered with the policy-invalid penalty), failed (the call failed, e.g. an engine was "
    "down: trainers mask these samples).", ("kind", "status"),
)
REWARDS = Histogram(
    "reward_server_reward", "Rewards answered, by reward kind and item status.",
    ("kind", "status"), buckets=_REWARD_BUCKETS,
)
REWARD_SUM = Gauge(  # the histogram has no _sum: prometheus_client drops it with negative buckets
    "reward_server_reward_running_sum", "Sum of the rewards answered since the process started, "
    "by reward kind and item status (mean reward: its delta over reward_server_reward_count's "
    "increase).", ("kind", "status"),
)
QUEUE_WAIT = Histogram(
    "reward_server_batch_queue_wait_seconds", "How long an engine batch formed in this process "
    "waited from its first item to its engine call (batching wait plus busy engine slots).",
    ("deployment",), buckets=_LATENCY_BUCKETS,
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


_CALL_CHILDREN: dict[tuple[str, str, str], tuple[Any, Any]] = {}  # bounded: methods x codes x 2


def observe_call(rpc: str, code: str, seconds: float, *, transport: str) -> None:
    """One finished reward.v1 call: ``rpc`` is the method name (Score, Verify, ...), ``code``
    the gRPC status code name (OK, RESOURCE_EXHAUSTED, ...), ``transport`` grpc or http."""
    key = (rpc, code, transport)
    children = _CALL_CHILDREN.get(key)
    if children is None:  # looked up once: labels() takes a lock and hashes (~1.5 us each)
        children = _CALL_CHILDREN[key] = (RPC_CALLS.labels(*key), RPC_LATENCY.labels(*key))
    children[0].inc()
    children[1].observe(seconds)


def observe_item(kind: str, status: str, reward: float | None) -> None:
    """One item of reward ``kind`` (rubric_score, parl_reward, ...) answered with ``status``
    (ok, policy_invalid) and ``reward``."""
    ITEMS.labels(kind, status).inc()
    if reward is not None:
        REWARDS.labels(kind, status).observe(reward)
        REWARD_SUM.labels(kind, status).inc(reward)


def observe_failed_items(kind: str, n: int) -> None:
    """``n`` items of reward ``kind`` were in a Score call that failed (no reward answered)."""
    if n > 0:
        ITEMS.labels(kind, ITEM_FAILED).inc(n)


def observe_batch(deployment: str, size: int) -> None:
    """One engine batch of ``size`` items was formed for ``deployment`` (judge, nli)."""
    BATCH_ITEMS.labels(deployment).observe(size)


def observe_queue_wait(deployment: str, seconds: float) -> None:
    """A batch for ``deployment`` waited ``seconds`` before its engine call started."""
    QUEUE_WAIT.labels(deployment).observe(seconds)


def observe_engine_call(deployment: str, method: str, outcome: str, seconds: float) -> None:
    """One call to an engine deployment finished with ``outcome``."""
    ENGINE_CALLS.labels(deployment, method, outcome).inc()
    if outcome == "ok":
        ENGINE_LATENCY.labels(deployment, method).observe(seconds)


def watch_admitted(judgments: Callable[[], float], nbytes: Callable[[], float]) -> None:
    """The work admission control holds, read when scraped (nothing to do per call)."""
    ADMITTED.labels("judgments").set_function(judgments)
    ADMITTED.labels("bytes").set_function(nbytes)


def set_admission_limits(judgments: int | None, calls: int | None) -> None:
    """The admission limits in force now (None: unlimited, not set)."""
    if judgments is not None:
        LIMITS.labels("judgments").set(judgments)
    if calls is not None:
        LIMITS.labels("calls").set(calls)


_REFUSED_CHILDREN: dict[tuple[str, str], Any] = {}  # bounded: limits x stages


def observe_refusal(limit: str, stage: str) -> None:
    """One call refused at ``stage`` because the ``limit`` (judgments, bytes) was full."""
    child = _REFUSED_CHILDREN.get((limit, stage))
    if child is None:
        child = _REFUSED_CHILDREN[(limit, stage)] = REFUSED.labels(limit, stage)
    child.inc()


@contextmanager
def track_in_flight(deployment: str) -> Iterator[None]:
    """Count a call towards ``deployment`` as in flight while the block runs."""
    gauge = IN_FLIGHT.labels(deployment)
    gauge.inc()
    try:
        yield
    finally:
        gauge.dec()


def exposition() -> tuple[bytes, str]:
    """Every metric of this process in Prometheus' text format, and its content type."""
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


# How often the metrics thread looks whether it was asked to stop: a server's stop waits for
# that look (prometheus_client's start_http_server serves with socketserver's 0.5 s, which cost
# each stop 0.25 s on average and 0.5 s at worst).
STOP_POLL_S = 0.05


class _QuietHandler(WSGIRequestHandler):
    """No access-log line on stderr per scrape (as prometheus_client's own server)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _server_class(family: socket.AddressFamily) -> type[ThreadingWSGIServer]:
    class Server(ThreadingWSGIServer):
        address_family = family

    return Server


class MetricsServer:
    """``/metrics`` (Prometheus text format) on its own port, from a daemon thread: what
    prometheus_client's ``start_http_server`` builds (its WSGI app and threading server, the
    address family from ``addr``), served with a short stop poll (:data:`STOP_POLL_S`)."""

    def __init__(self, port: int, *, addr: str = "127.0.0.1") -> None:
        family, _, _, _, sockaddr = socket.getaddrinfo(
            addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        self._server = make_server(str(sockaddr[0]), port, make_wsgi_app(REGISTRY),
                                   _server_class(family), handler_class=_QuietHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(STOP_POLL_S,),
                                        name="metrics-http", daemon=True)
        self._thread.start()
        self.port = int(self._server.server_port)
        logger.info("Prometheus metrics on http://%s:%d/metrics",
                    f"[{addr}]" if ":" in addr else addr, self.port)

    def close(self) -> None:
        """Stop serving and free the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
