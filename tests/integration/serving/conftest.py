"""Engines as Ray Serve deployments on the session's local Ray, with fake engines."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from reward_server.backends.base import JudgeEngine, NLIEngine
from reward_server.backends.fake import FakeJudge, FakeNLI
from reward_server.backends.settings import JudgeSettings, NLIEngineSettings
from reward_server.config import RewardServerConfig, load_config
from reward_server.serving import Engines, start_engines


def serving_config(prefix: str, overrides: Sequence[str] = ()) -> RewardServerConfig:
    """ray mode, fake engines, replicas that take no CPU (2-core CI), short autoscaling delays
    and stops."""
    base = [
        "engines={judge: {kind: fake}, nli: {kind: fake}}",
        "serving.mode=ray",
        f"serving.ray.app_prefix={prefix}",
        "serving.ray.call_timeout_s=60",
        "serving.ray.ready_timeout_s=120",
    ]
    for kind in ("judge", "nli"):
        base += [
            f"serving.ray.{kind}.num_cpus=0",
            f"serving.ray.{kind}.upscale_delay_s=0.5",
            f"serving.ray.{kind}.downscale_delay_s=2",
            f"serving.ray.{kind}.look_back_period_s=1",
            f"serving.ray.{kind}.health_check_period_s=2",
            # a replica's stop (deletions at each fixture's end, scale-downs) looks for calls
            # in flight every 0.1 s, not Serve's 2 s
            f"serving.ray.{kind}.graceful_shutdown_wait_loop_s=0.1",
        ]
    return load_config(overrides=[*base, *overrides], env={})


def start(config: RewardServerConfig, **factories: Any) -> Any:
    """start_engines for a test config (RayEngines in ray mode)."""
    engines: Engines = start_engines(config.engines, config.serving, **factories)
    return engines


def fake_judge_factory(
    *, latency_s: float = 0.0, n_scripted: int = 0
) -> Callable[[JudgeSettings], JudgeEngine]:
    """A replica-side factory: FakeJudge with latency; ``generate`` with seed i answers
    ``out-i`` (i < n_scripted), so every answer names the request it belongs to."""
    scripted = [f"out-{i}" for i in range(n_scripted)] or None

    def make(settings: JudgeSettings) -> JudgeEngine:  # a closure: pickled by value
        return FakeJudge(scripted=scripted, latency_s=latency_s, model_id=f"fake:{settings.kind}")

    return make


def fake_nli_factory(*, latency_s: float = 0.0) -> Callable[[NLIEngineSettings], NLIEngine]:
    def make(settings: NLIEngineSettings) -> NLIEngine:
        return FakeNLI(max_length=getattr(settings, "max_length", 512), latency_s=latency_s)

    return make


async def answers(probe: Callable[[], Awaitable[Any]], want: Any, *, timeout_s: float) -> bool:
    """Whether ``probe()`` answers ``want`` within ``timeout_s`` (asked every 0.1 s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await probe() == want:
            return True
        await asyncio.sleep(0.1)
    return False


def all_sizes(stats: dict[str, dict[str, Any]], method: str) -> list[int]:
    return [n for s in stats.values() for n in s["batch_sizes"].get(method, [])]


@pytest.fixture(scope="session")
def kit() -> SimpleNamespace:
    """The helpers above, for test modules (conftest modules are not importable)."""
    return SimpleNamespace(
        config=serving_config,
        start=start,
        judge_factory=fake_judge_factory,
        nli_factory=fake_nli_factory,
        all_sizes=all_sizes,
        answers=answers,
    )
