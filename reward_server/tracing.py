"""OpenTelemetry spans for an RPC and the engine calls it makes: off by default, and a no-op
when the ``opentelemetry`` package is missing.

``configure(enabled=True)`` makes :func:`span` record through the global tracer provider, so
whatever the process set up is used (``opentelemetry-instrument``, or your own SDK setup).
With ``otlp_endpoint`` and the OpenTelemetry SDK and OTLP/HTTP exporter installed, this module
sets up that provider itself (service name ``reward-server``)::

    server:
      tracing: {enabled: true, otlp_endpoint: http://collector:4318/v1/traces}

Spans: ``reward.v1/<Method>`` per RPC (items, code) and ``engine.<name>.<method>`` per engine
batch (items), nested under the RPC whose call opened the batch.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger(__name__)

_tracer: Any = None


def configure(*, enabled: bool, otlp_endpoint: str | None = None) -> bool:
    """Turn spans on or off; True if they are on (the API package is importable)."""
    global _tracer
    if not enabled:
        _tracer = None
        return False
    try:
        from opentelemetry import trace
    except ImportError:
        logger.warning("tracing is on but opentelemetry is not installed: no spans "
                       "(pip install opentelemetry-sdk opentelemetry-exporter-otlp-proto-http)")
        _tracer = None
        return False
    if otlp_endpoint:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError:
            logger.warning("server.tracing.otlp_endpoint needs opentelemetry-sdk and "
                           "opentelemetry-exporter-otlp-proto-http; using the global provider")
        else:
            provider = TracerProvider(resource=Resource.create({"service.name": "reward-server"}))
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint)))
            trace.set_tracer_provider(provider)
            logger.info("tracing: OTLP/HTTP spans to %s", otlp_endpoint)
    _tracer = trace.get_tracer("reward_server")
    return True


@contextlib.contextmanager
def span(name: str, **attributes: str | int | float | bool) -> Iterator[Any]:
    """A span around the block when tracing is on; nothing otherwise. Yields the span (or
    None) so the block can add attributes with :func:`set_attribute`."""
    if _tracer is None:
        yield None
        return
    with _tracer.start_as_current_span(name, attributes=attributes) as current:
        yield current


def set_attribute(current: Any, key: str, value: str | int | float | bool) -> None:
    if current is not None:
        current.set_attribute(key, value)
