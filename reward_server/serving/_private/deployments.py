"""The Ray Serve deployments: one replica = one engine, with ``@serve.batch`` re-batching.

Ingresses send calls of at most ``max_items`` (their batcher cut them); ``@serve.batch``
joins the calls already queued at the replica, up to ``max_items`` items in total
(``batch_size_fn`` counts items, not calls) and without waiting for more (the ingress batcher
holds the one timer), runs them as one engine call and splits the results back, in order, one
list per call. A call bigger than ``max_items`` (an ingress of another version) is cut first,
so no single call can exceed a batch.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import ray
from pydantic import TypeAdapter
from ray import serve
from ray.serve.metrics import Histogram

from reward_server.backends.base import (
    GenerationRequest,
    JudgePrompt,
    NLIPair,
    NLIScore,
)
from reward_server.backends.settings import JudgeSettings, NLIEngineSettings
from reward_server.errors import BackendUnavailable, EngineError
from reward_server.serving.engines import JudgeFactory, NLIFactory

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

_BATCH_LOG_LEN = 10_000
_DEFAULT_MAX_BATCH = 256
_WAIT_S = 0.0  # no timer here: the ingress batcher already waited


def total_items(calls: list[Any]) -> int:
    """``batch_size_fn``: a batch's size is the number of items over all its calls."""
    return sum(len(c) for c in calls)


def chunks(items: Sequence[T], size: int) -> list[list[T]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def split_back(flat: Sequence[R], sizes: Sequence[int]) -> list[list[R]]:
    out: list[list[R]] = []
    start = 0
    for n in sizes:
        out.append(list(flat[start : start + n]))
        start += n
    return out


class _ReplicaBase:
    """What both deployments share: batch records, runtime knobs, health."""

    kind = "engine"

    def __init__(self) -> None:
        self._max_batch_size = _DEFAULT_MAX_BATCH
        self._unhealthy_after = 5
        self._consecutive_failures = 0
        self._batch_log: dict[str, deque[int]] = {}
        self._batch_hist = Histogram(
            "reward_server_replica_batch_items",
            description="Items per engine call formed by @serve.batch in a replica.",
            boundaries=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024],
            tag_keys=("method",),
        )
        ctx = serve.get_replica_context()
        self._node_id = ray.get_runtime_context().get_node_id()
        self._replica_id = ctx.replica_id.unique_id
        self._actor_name = ctx.replica_id.to_full_id_str()

    def _batchers(self) -> list[Any]:
        raise NotImplementedError

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Runtime knobs from ``user_config`` (see DeploymentSettings.user_config)."""
        unknown = set(user_config) - {"max_batch_size", "unhealthy_after_failures"}
        if unknown:
            raise ValueError(
                f"user_config keys {sorted(unknown)} are unknown; the replica reads "
                "max_batch_size (= engines.<kind>.batching.max_items) and unhealthy_after_failures"
            )
        self._max_batch_size = int(user_config.get("max_batch_size", self._max_batch_size))
        self._unhealthy_after = int(
            user_config.get("unhealthy_after_failures", self._unhealthy_after)
        )
        for batcher in self._batchers():
            batcher.set_max_batch_size(self._max_batch_size)
            batcher.set_batch_wait_timeout_s(_WAIT_S)
        logger.info(
            "%s replica %s: max_batch_size=%d", self.kind, self._replica_id, self._max_batch_size
        )

    async def _run_engine(self, method: str, call: Awaitable[list[R]], n: int) -> list[R]:
        self._batch_log.setdefault(method, deque(maxlen=_BATCH_LOG_LEN)).append(n)
        self._batch_hist.observe(n, tags={"method": method})  # Serve adds deployment/replica
        try:
            out = await call
        except Exception:
            self._consecutive_failures += 1
            raise
        if len(out) != n:
            self._consecutive_failures += 1
            raise EngineError(
                f"{self.kind} engine returned {len(out)} results for {n} inputs in one batch; "
                "the engine is broken (results cannot be matched to items)"
            )
        self._consecutive_failures = 0
        return out

    async def _pieces(
        self, items: Sequence[T], batched: Callable[[list[T]], Awaitable[list[R]]]
    ) -> list[R]:
        if not items:
            return []
        parts = chunks(items, self._max_batch_size)
        results = await asyncio.gather(*(batched(p) for p in parts))
        return [r for part in results for r in part]

    def batch_stats(self) -> dict[str, Any]:
        """This replica's id, its Ray node and the sizes of the batches it formed, per method."""
        return {
            "replica_id": self._replica_id,
            "actor_name": self._actor_name,
            "node_id": self._node_id,
            "batch_sizes": {m: list(log) for m, log in self._batch_log.items()},
        }

    def check_health(self) -> None:
        """Serve calls this periodically; raising makes Serve replace the replica."""
        if self._consecutive_failures >= self._unhealthy_after:
            raise BackendUnavailable(
                f"{self.kind} replica {self._replica_id}: {self._consecutive_failures} engine "
                "batches failed in a row"
            )


@serve.deployment(name="JudgeDeployment")
class JudgeDeployment(_ReplicaBase):
    """A judge engine replica: ``p_yes`` and ``generate``, both re-batched."""

    kind = "judge"

    def __init__(
        self, engine_settings: dict[str, Any], engine_factory: JudgeFactory | None = None
    ) -> None:
        super().__init__()
        settings = TypeAdapter(JudgeSettings).validate_python(engine_settings)
        if engine_factory is None:
            from reward_server.backends.factory import build_judge

            engine_factory = build_judge
        self._engine = engine_factory(settings)
        logger.info("judge replica %s ready: %s", self._replica_id, self._engine.model_id)

    def _batchers(self) -> list[Any]:
        return [self._p_yes_batch, self._generate_batch]

    def info(self) -> dict[str, Any]:
        return {"model_id": self._engine.model_id}

    async def p_yes(self, prompts: list[JudgePrompt]) -> list[float]:
        return await self._pieces(prompts, self._p_yes_batch)

    async def generate(self, requests: list[GenerationRequest]) -> list[str]:
        return await self._pieces(requests, self._generate_batch)

    @serve.batch(  # type: ignore[untyped-decorator]
        max_batch_size=_DEFAULT_MAX_BATCH,
        batch_wait_timeout_s=_WAIT_S,
        batch_size_fn=total_items,
    )
    async def _p_yes_batch(self, calls: list[list[JudgePrompt]]) -> list[list[float]]:
        flat = [p for call in calls for p in call]
        scores = await self._run_engine("p_yes", self._engine.p_yes(flat), len(flat))
        return split_back(scores, [len(c) for c in calls])

    @serve.batch(  # type: ignore[untyped-decorator]
        max_batch_size=_DEFAULT_MAX_BATCH,
        batch_wait_timeout_s=_WAIT_S,
        batch_size_fn=total_items,
    )
    async def _generate_batch(self, calls: list[list[GenerationRequest]]) -> list[list[str]]:
        flat = [r for call in calls for r in call]
        texts = await self._run_engine("generate", self._engine.generate(flat), len(flat))
        return split_back(texts, [len(c) for c in calls])


@serve.deployment(name="NLIDeployment")
class NLIDeployment(_ReplicaBase):
    """An NLI cross-encoder replica: ``entailment`` re-batched; ``token_counts`` direct."""

    kind = "nli"

    def __init__(
        self, engine_settings: dict[str, Any], engine_factory: NLIFactory | None = None
    ) -> None:
        super().__init__()
        settings = TypeAdapter(NLIEngineSettings).validate_python(engine_settings)
        if engine_factory is None:
            from reward_server.backends.factory import build_nli

            engine_factory = build_nli
        self._engine = engine_factory(settings)
        logger.info("NLI replica %s ready: %s", self._replica_id, self._engine.model_id)

    def _batchers(self) -> list[Any]:
        return [self._entailment_batch]

    def info(self) -> dict[str, Any]:
        return {"model_id": self._engine.model_id, "max_length": self._engine.max_length}

    async def token_counts(self, texts: list[str]) -> list[int]:
        return await self._engine.token_counts(texts)

    async def entailment(self, pairs: list[NLIPair]) -> list[NLIScore]:
        return await self._pieces(pairs, self._entailment_batch)

    @serve.batch(  # type: ignore[untyped-decorator]
        max_batch_size=_DEFAULT_MAX_BATCH,
        batch_wait_timeout_s=_WAIT_S,
        batch_size_fn=total_items,
    )
    async def _entailment_batch(self, calls: list[list[NLIPair]]) -> list[list[NLIScore]]:
        flat = [p for call in calls for p in call]
        scores = await self._run_engine("entailment", self._engine.entailment(flat), len(flat))
        return split_back(scores, [len(c) for c in calls])
