"""Coalesce concurrent small engine calls into one batch (in-process hosting).

verl sends one reward request per finished rollout, so an in-process server sees many
concurrent calls of a few prompts each. ``CoalescingJudge`` / ``CoalescingNLI`` wrap an engine
and merge the calls that arrive within ``max_wait_s`` (or until ``max_batch`` items) into one
engine call, then hand each caller its own slice, in order. If the merged call fails, every
caller in it gets the exception: a failure is never turned into numbers. (Under Ray Serve,
``@serve.batch`` does this job instead.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from reward_server.backends.base import (
    GenerationRequest,
    JudgeEngine,
    JudgePrompt,
    NLIEngine,
    NLIPair,
    NLIScore,
)

logger = logging.getLogger(__name__)
Q = TypeVar("Q")
R = TypeVar("R")


class Coalescer(Generic[Q, R]):
    """Merges concurrent ``submit`` calls into batched calls of ``fn``."""

    def __init__(
        self, fn: Callable[[Sequence[Q]], Awaitable[list[R]]], *, max_batch: int, max_wait_s: float
    ) -> None:
        if max_batch < 1 or max_wait_s < 0:
            raise ValueError("max_batch must be >= 1 and max_wait_s >= 0")
        self._fn = fn
        self._max_batch = max_batch
        self._max_wait_s = max_wait_s
        self._pending: list[tuple[Sequence[Q], asyncio.Future[list[R]]]] = []
        self._pending_items = 0
        self._timer: asyncio.TimerHandle | None = None
        self._running: set[asyncio.Task[None]] = set()
        self.batch_sizes: list[int] = []  # items per merged call, for tests and benchmarks

    async def submit(self, items: Sequence[Q]) -> list[R]:
        if not items:
            return []
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[R]] = loop.create_future()
        self._pending.append((items, future))
        self._pending_items += len(items)
        if self._pending_items >= self._max_batch:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self._max_wait_s, self._flush)
        return await future

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending, self._pending_items = self._pending, [], 0
        if batch:
            task = asyncio.ensure_future(self._run(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _run(self, batch: list[tuple[Sequence[Q], asyncio.Future[list[R]]]]) -> None:
        flat = [q for items, _ in batch for q in items]
        self.batch_sizes.append(len(flat))
        try:
            results = await self._fn(flat)
            if len(results) != len(flat):
                raise RuntimeError(f"engine returned {len(results)} results for {len(flat)} inputs")
        except BaseException as exc:  # every caller of the merged call sees the failure
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        start = 0
        for items, fut in batch:
            if not fut.done():
                fut.set_result(results[start : start + len(items)])
            start += len(items)


class CoalescingJudge:
    """A JudgeEngine that merges concurrent ``p_yes`` calls (generation passes through)."""

    def __init__(self, engine: JudgeEngine, *, max_batch: int, max_wait_s: float) -> None:
        self.engine = engine
        self._p_yes: Coalescer[JudgePrompt, float] = Coalescer(
            engine.p_yes, max_batch=max_batch, max_wait_s=max_wait_s
        )

    @property
    def model_id(self) -> str:
        return self.engine.model_id

    @property
    def batch_sizes(self) -> list[int]:
        return self._p_yes.batch_sizes

    async def p_yes(self, prompts: Sequence[JudgePrompt]) -> list[float]:
        return await self._p_yes.submit(prompts)

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[str]:
        return await self.engine.generate(requests)

    async def close(self) -> None:
        await self.engine.close()


class CoalescingNLI:
    """An NLIEngine that merges concurrent ``entailment`` calls."""

    def __init__(self, engine: NLIEngine, *, max_batch: int, max_wait_s: float) -> None:
        self.engine = engine
        self._entail: Coalescer[NLIPair, NLIScore] = Coalescer(
            engine.entailment, max_batch=max_batch, max_wait_s=max_wait_s
        )

    @property
    def model_id(self) -> str:
        return self.engine.model_id

    @property
    def max_length(self) -> int:
        return self.engine.max_length

    @property
    def batch_sizes(self) -> list[int]:
        return self._entail.batch_sizes

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        return self.engine.token_counts(texts)

    async def entailment(self, pairs: Sequence[NLIPair]) -> list[NLIScore]:
        return await self._entail.submit(pairs)

    async def close(self) -> None:
        await self.engine.close()
