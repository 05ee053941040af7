"""Merge concurrent engine calls into batches: the one batching stage in front of an engine.

verl sends one reward request per finished rollout, so the server sees many concurrent calls of
a few prompts each. :class:`Batcher` packs the items of the calls that arrive within
``wait_ms`` of a batch's first item into engine calls of at most ``max_items`` (a big call is
spread over several batches; a batch can hold pieces of several calls), then hands each caller
its own results, in order. With ``max_in_flight``, at most that many engine calls run at once:
a batch whose wait is over while every slot is busy keeps taking items (up to ``max_items``)
and starts when a call returns, so under load batches grow rather than the number of calls
(what a Ray deployment call, with its fixed cost, needs). If an engine call fails, every
caller with items in it gets the exception (classified by
:func:`reward_server.errors.engine_failure`: infrastructure or bug): a failure is never turned
into numbers. The same block runs in front of an in-process engine and in front of a Ray Serve
deployment handle.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from reward_server import metrics, tracing
from reward_server.backends.base import (
    GenerationRequest,
    Health,
    JudgeEngine,
    JudgePrompt,
    NLIEngine,
    NLIPair,
    NLIScore,
)
from reward_server.backends.settings import BatchingSettings
from reward_server.errors import BackendUnavailable, EngineError, engine_failure

logger = logging.getLogger(__name__)
Q = TypeVar("Q")
R = TypeVar("R")

RECENT_BATCHES = 1024  # batch sizes kept for tests and benchmarks (bounded)


@dataclass
class BatchStats:
    """Counters of one batcher; ``recent`` holds the latest batch sizes only."""

    batches: int = 0
    items: int = 0
    largest: int = 0
    recent: deque[int] = field(default_factory=lambda: deque(maxlen=RECENT_BATCHES))

    def record(self, n: int) -> None:
        self.batches += 1
        self.items += n
        self.largest = max(self.largest, n)
        self.recent.append(n)


class _Batch(Generic[Q, R]):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.items: list[Q] = []
        self.future: asyncio.Future[list[R]] = loop.create_future()
        self.created = loop.time()


class Batcher(Generic[Q, R]):
    """Packs concurrent ``submit`` calls into calls of ``fn`` (see the module doc)."""

    def __init__(
        self,
        fn: Callable[[Sequence[Q]], Awaitable[list[R]]],
        *,
        max_items: int,
        wait_s: float,
        name: str = "engine",
        max_in_flight: int | None = None,
    ) -> None:
        if max_items < 1 or wait_s < 0 or (max_in_flight is not None and max_in_flight < 1):
            raise ValueError("max_items must be >= 1, wait_s >= 0 and max_in_flight >= 1 or None")
        self._fn = fn
        self._max_items = max_items
        self._wait_s = wait_s
        self._name = name
        self._max_in_flight = max_in_flight
        self._current: _Batch[Q, R] | None = None
        self._due = False  # the current batch's wait is over; it starts when a call slot frees
        self._ready: deque[_Batch[Q, R]] = deque()  # full batches waiting for a call slot
        self._timer: asyncio.TimerHandle | None = None
        self._running: set[asyncio.Task[None]] = set()
        self.stats = BatchStats()

    @property
    def max_items(self) -> int:
        return self._max_items

    async def submit(self, items: Sequence[Q]) -> list[R]:
        if not items:
            return []
        loop = asyncio.get_running_loop()
        segments: list[tuple[_Batch[Q, R], int, int]] = []
        i = 0
        while i < len(items):
            batch = self._current
            if batch is None:
                batch = self._current = _Batch(loop)
                self._timer = loop.call_later(self._wait_s, self._flush)
            take = items[i : i + self._max_items - len(batch.items)]
            start = len(batch.items)
            batch.items.extend(take)
            segments.append((batch, start, start + len(take)))
            i += len(take)
            if len(batch.items) >= self._max_items:
                self._flush()
        out: list[R] = []
        for batch, a, b in segments:
            # shield: a caller that is cancelled must not cancel a batch other callers share
            out.extend((await asyncio.shield(batch.future))[a:b])
        return out

    def _flush(self) -> None:
        """The current batch is full or its wait is over: start it, or (every call slot busy)
        queue it if full, else let it keep filling until a slot frees."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch = self._current
        if batch is None or not batch.items:
            return
        full = len(batch.items) >= self._max_items
        busy = self._max_in_flight is not None and (len(self._running) >= self._max_in_flight or bool(self._ready))
        if busy:
            if full:
                self._ready.append(batch)
                self._current, self._due = None, False
            else:
                self._due = True
            return
        self._current, self._due = None, False
        self._start(batch)

    def _start(self, batch: _Batch[Q, R]) -> None:
        task = asyncio.ensure_future(self._run(batch))
        self._running.add(task)
        task.add_done_callback(self._call_done)

    def _call_done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        if self._ready:
            self._start(self._ready.popleft())
        elif self._due and self._current is not None:
            batch, self._current, self._due = self._current, None, False
            self._start(batch)

    async def _run(self, batch: _Batch[Q, R]) -> None:
        n = len(batch.items)
        self.stats.record(n)
        metrics.observe_batch(self._name, n)
        metrics.observe_queue_wait(self._name, asyncio.get_running_loop().time() - batch.created)
        try:
            with tracing.span(f"engine.{self._name}", items=n):
                results = await self._fn(batch.items)
            if len(results) != n:
                raise EngineError(
                    f"{self._name} engine returned {len(results)} results for {n} inputs"
                )
        except asyncio.CancelledError:  # the server is stopping: the callers learn it
            self._fail(batch, BackendUnavailable(
                f"the {self._name} engine call was cancelled before it answered; retry the call"
            ))
            raise
        except Exception as exc:  # every caller with items in this batch sees the failure
            # infrastructure (UNAVAILABLE, retried) or a bug (INTERNAL, not retried)
            self._fail(batch, engine_failure(exc, f"the {self._name} engine on {n} items"))
            return
        if not batch.future.done():
            batch.future.set_result(results)

    @staticmethod
    def _fail(batch: _Batch[Q, R], exc: BaseException) -> None:
        if not batch.future.done():
            batch.future.set_exception(exc)
            batch.future.exception()  # retrieved: nothing is logged if every caller went away


class BatchedJudge:
    """A JudgeEngine whose ``p_yes`` calls go through a :class:`Batcher` (``max_in_flight``:
    the hosting's default, used when ``batching.max_in_flight`` is None)."""

    def __init__(
        self, engine: JudgeEngine, batching: BatchingSettings, *, name: str = "judge", max_in_flight: int | None = None
    ) -> None:
        self.engine = engine
        self.batcher: Batcher[JudgePrompt, float] = Batcher(
            engine.p_yes, max_items=batching.max_items, wait_s=batching.wait_ms / 1000, name=name,
            max_in_flight=batching.max_in_flight or max_in_flight,
        )

    @property
    def model_id(self) -> str:
        return self.engine.model_id

    async def p_yes(self, prompts: Sequence[JudgePrompt]) -> list[float]:
        return await self.batcher.submit(prompts)

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[str]:
        return await self.engine.generate(requests)

    async def health(self) -> Health:
        return await self.engine.health()

    async def close(self) -> None:
        await self.engine.close()


class BatchedNLI:
    """An NLIEngine whose ``entailment`` calls go through a :class:`Batcher` (``max_in_flight``
    as in :class:`BatchedJudge`)."""

    def __init__(
        self, engine: NLIEngine, batching: BatchingSettings, *, name: str = "nli", max_in_flight: int | None = None
    ) -> None:
        self.engine = engine
        self.batcher: Batcher[NLIPair, NLIScore] = Batcher(
            engine.entailment, max_items=batching.max_items, wait_s=batching.wait_ms / 1000,
            name=name, max_in_flight=batching.max_in_flight or max_in_flight,
        )

    @property
    def model_id(self) -> str:
        return self.engine.model_id

    @property
    def max_length(self) -> int:
        return self.engine.max_length

    async def token_counts(self, texts: Sequence[str]) -> list[int]:
        return await self.engine.token_counts(texts)

    async def entailment(self, pairs: Sequence[NLIPair]) -> list[NLIScore]:
        return await self.batcher.submit(pairs)

    async def health(self) -> Health:
        return await self.engine.health()

    async def close(self) -> None:
        await self.engine.close()
