"""The pieces every reward server process composes the same way: the service over its engines
(:func:`build_service`, its admission sized by :func:`engine_batches`; :class:`LocalService`,
the two together) and the garbage collector of a serving process (:func:`tune_gc_for_serving`).
Used by :mod:`reward_server.app` (the ingress and its in-process service) and
:mod:`reward_server.service_deployment` (the replicas of ``serving.ray.layout: service``)."""

from __future__ import annotations

import gc
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reward_server.backends.base import Health
from reward_server.backends.settings import JudgeNLISettings, judge_info
from reward_server.config import RewardServerConfig
from reward_server.service import RewardService
from reward_server.serving import Engines


def engine_batches(config: RewardServerConfig) -> tuple[int, int]:
    """Items one full batch of every replica of the judge and of a separate NLI engine holds:
    their ``batching.max_items`` times their most replicas on Ray (0 for an engine the config
    does not name; judge-as-NLI sends its pairs to the judge). Sizes the default admission."""
    out = []
    for name in ("judge", "nli"):
        engine = getattr(config.engines, name)
        if engine is None or isinstance(engine, JudgeNLISettings):
            out.append(0)
            continue
        replicas = 1
        if config.serving.mode == "ray":
            replicas = getattr(config.serving.ray, name).max_replicas
        out.append(engine.batching.max_items * replicas)
    return out[0], out[1]


def build_service(config: RewardServerConfig, engines: Engines) -> RewardService:
    """The orchestration layer over ``engines`` with the config's science, limits and
    admission control (sized for the engines, see :func:`engine_batches`)."""
    judge_items, nli_items = engine_batches(config)
    return RewardService(
        judge=engines.judge,
        nli=engines.nli,
        settings=config.service,
        rubric_settings=config.rubric,
        nli_settings=config.nli,
        fake_engines=config.engines.fake,
        engine_batch_items=max(1, judge_items + nli_items),
        nli_batch_items=nli_items,
        engine_info=judge_info(config.engines.judge),
    )


@dataclass(frozen=True)
class LocalService:
    """The reward service in this process over its engines (in this process or as Ray Serve
    engine deployments): what serves the calls of a server without service replicas, and of
    each service replica."""

    engines: Engines
    service: RewardService

    @classmethod
    def build(cls, config: RewardServerConfig, engines: Engines) -> LocalService:
        return cls(engines, build_service(config, engines))

    async def health(self) -> Mapping[Any, Health]:
        return await self.engines.health()

    async def close(self) -> None:
        await self.engines.close()


SERVER_GC_THRESHOLDS = (25_000, 50, 100)  # gc.set_threshold of a serving process (see below)


def tune_gc_for_serving() -> None:
    """Python's cyclic GC as a serving process wants it; call once start-up is done (what
    ``reward-server serve`` does after :func:`start_app`).

    What start-up loaded (modules, models) lives as long as the process: ``gc.freeze()`` keeps
    it out of the full collections, whose pauses would otherwise hold the event loop (health).
    Fewer young collections: with thousands of items in flight (64 calls x 256 items) the
    default thresholds (700, 10, 10) made the collector's passes over the live objects grow
    with the load; measured (bench/scaling.py --per-call 256 --concurrency 16 64 --min-s 15,
    with and without --gc-gen0 50000): server CPU per item 0.254 -> 0.214 ms at 16 and
    0.387 -> 0.237 ms at 64, items/s at 64 2,569 -> 3,699. Garbage reference cycles live
    longer in exchange (the idle trim runs a full collection, rpc/memory.py).

    The young threshold is 25,000, not the 50,000 first measured: each finished call then left
    a reference cycle in gRPC (its call state and the done callbacks it holds), freed only by
    a collection, and a young pass freed all that came since the last one at once (the done
    callbacks' cycles are gone, :func:`reward_server.rpc.grpc_metrics.when_done`; the request
    iterator's remains). In a run
    of bench/faults.py the 50,000 passes held the event loop up to 118 ms (health checks
    queue behind such holds); in a run at 25,000 the longest was 67 ms, at the same
    throughput (bench/scaling.py --per-call 1 256 --concurrency 64 --min-s 15, 256-item
    calls: 3,389 items/s at 50,000, 3,487 at 25,000, 2,838 at 10,000; one run each).
    """
    gc.freeze()
    gc.set_threshold(*SERVER_GC_THRESHOLDS)
