"""``RewardClient``: the synchronous facade over :class:`~reward_server.client.client.AsyncRewardClient`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from types import TracebackType
from typing import Any, TypeVar

from reward_server import domain as d
from reward_server.client.channel import RetryBudget, Target
from reward_server.client.client import AsyncRewardClient

__all__ = ["RewardClient"]

T = TypeVar("T")


class RewardClient:
    """Synchronous facade over :class:`AsyncRewardClient`, from plain code or inside a running
    event loop (a notebook): its own loop runs in a background thread, where the channel lives,
    and each call is handed over with :func:`asyncio.run_coroutine_threadsafe`. Inside a running
    loop a call blocks that loop until it is answered (a server on that same loop could not
    answer: use :class:`AsyncRewardClient` there). Keyword arguments: those of
    :class:`AsyncRewardClient` (``retry=RetryBudget(...)``, ``timeout_s``, ``token``, ...).
    ``close()`` (or leaving the ``with`` block) closes the channel and joins the thread."""

    def __init__(self, target: Target, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name=f"RewardClient({target})")
        self._thread.start()
        try:
            self._client: AsyncRewardClient = self._run(self._make(target, kwargs))
        except BaseException:
            self._stop()
            raise

    @staticmethod
    async def _make(target: Target, kwargs: dict[str, Any]) -> AsyncRewardClient:
        return AsyncRewardClient(target, **kwargs)  # on the client's loop: the channel's home

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop.is_closed() or not self._thread.is_alive():
            coro.close()
            raise RuntimeError("this RewardClient is closed; make a new one")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def retry(self) -> RetryBudget:
        return self._client.retry

    def __enter__(self) -> RewardClient:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def score(self, items: Sequence[d.ScoreItem], **kw: Any) -> list[d.ItemResult]:
        return self._run(self._client.score(items, **kw))

    def induce_rubrics(self, history: Sequence[d.HistoryItem], **kw: Any) -> d.InductionResult:
        return self._run(self._client.induce_rubrics(history, **kw))

    def verify(self, **kw: Any) -> d.Verification:
        return self._run(self._client.verify(**kw))

    def info(self, **kw: Any) -> d.ServerInfo:
        return self._run(self._client.info(**kw))

    def health(self, service: str = "", **kw: Any) -> str:
        return self._run(self._client.health(service, **kw))

    def close(self) -> None:
        """Close the channel, stop the loop and join its thread (idempotent)."""
        if self._loop.is_closed():
            return
        try:
            if self._thread.is_alive() and hasattr(self, "_client"):
                self._run(self._client.close())
        finally:
            self._stop()

    def _stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()
