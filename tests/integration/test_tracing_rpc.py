"""server.tracing: a span per call (gRPC and HTTP) with its engine batches as children; off by
default. Needs opentelemetry-sdk (Ray's serve extra brings it; skipped without)."""

from __future__ import annotations

import aiohttp
import pytest

from reward_server import domain as d

from .conftest import running_server

pytest.importorskip("opentelemetry.sdk.trace", reason="opentelemetry-sdk not installed")
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

ITEM = d.ScoreItem("a", d.RubricScoreSpec("c", "coffee", ('The text mentions "coffee".',)))
BODY = {"items": [{"id": "a", "rubric_score": {"context": "c", "text": "coffee",
                                               "rules": ['The text mentions "coffee".']}}]}


async def _one_of_each(overrides: list[str]) -> None:
    async with running_server(["server.http.port=0", *overrides]) as r:
        async with r.client() as c:
            await c.score([ITEM])
        async with aiohttp.ClientSession() as s, s.post(
                f"http://127.0.0.1:{r.app.http_port}/v1/score", json=BODY) as resp:
            assert resp.status == 200


async def test_off_by_default(exported: InMemorySpanExporter) -> None:
    await _one_of_each([])
    assert exported.get_finished_spans() == ()


async def test_a_span_per_call_with_its_engine_batches_inside(
    exported: InMemorySpanExporter,
) -> None:
    await _one_of_each(["server.tracing.enabled=true"])
    spans = exported.get_finished_spans()
    calls = [s for s in spans if s.name == "reward.v1/Score"]
    assert sorted(str(s.attributes["transport"]) for s in calls) == ["grpc", "http"]  # type: ignore[index]
    for call in calls:
        assert call.attributes is not None
        assert call.attributes["code"] == "OK" and call.attributes["items"] == 1
        children = [s for s in spans if s.parent is not None
                    and s.parent.span_id == call.context.span_id]  # type: ignore[union-attr]
        assert [s.name for s in children] == ["engine.judge"]
