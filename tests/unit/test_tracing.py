"""Tracing: off by default (no spans, no cost), and when on, engine batches become spans."""

from __future__ import annotations

import asyncio

import pytest

from reward_server import tracing
from reward_server.backends.fake import FakeJudge
from reward_server.backends.settings import BatchingSettings
from reward_server.domain import Task
from reward_server.rubric.templates import judge_prompt
from reward_server.serving.batching import BatchedJudge

sdk = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402


async def _two_calls() -> None:
    judge = BatchedJudge(FakeJudge(), BatchingSettings(max_items=8, wait_ms=5))
    p = judge_prompt("", "coffee", 'Mentions "coffee".', Task.GENERIC)
    with tracing.span("reward.v1/Score", items=2):
        await asyncio.gather(judge.p_yes([p]), judge.p_yes([p]))


async def test_off_by_default_records_nothing(exported: InMemorySpanExporter) -> None:
    tracing.configure(enabled=False)
    await _two_calls()
    assert exported.get_finished_spans() == ()


async def test_on_records_the_rpc_and_its_engine_batch(exported: InMemorySpanExporter) -> None:
    assert tracing.configure(enabled=True)
    await _two_calls()
    spans = {s.name: s for s in exported.get_finished_spans()}
    assert set(spans) == {"reward.v1/Score", "engine.judge"}
    engine, rpc = spans["engine.judge"], spans["reward.v1/Score"]
    assert engine.attributes is not None and engine.attributes["items"] == 2  # one merged batch
    assert engine.parent is not None and engine.parent.span_id == rpc.context.span_id
