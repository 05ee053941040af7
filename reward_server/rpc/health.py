"""Live grpc.health.v1: the serving status follows the engines.

:class:`HealthMonitor` asks a probe (``Engines.health``: ``{"judge": Health, "nli": Health}``)
every ``server.health_poll_s`` and at once after an engine failure (:meth:`HealthMonitor.poke`),
and sets every name it serves (the whole server ``""`` and ``reward.v1.RewardService``) to
NOT_SERVING while any required engine is down (no live replica, or its last check failed) and
back to SERVING when all are up again, as TEI and vLLM do. A probe that raises or takes longer
than its timeout counts as down. ``conditions`` adds what else makes the server unable to take
calls (the main port's connections at their cap, :mod:`reward_server.rpc.connections`), so that
health tells the truth when new connections are refused. Once the server drains,
:meth:`HealthMonitor.stop` pins NOT_SERVING.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

from reward_server.backends.base import Health

logger = logging.getLogger(__name__)

Probe = Callable[[], Awaitable[Mapping[Any, Health]]]  # engine name -> its health
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class HealthMonitor:
    """Drives a grpc.health.v1 servicer from a probe (see the module doc)."""

    def __init__(
        self,
        servicer: HealthServicer,
        names: Sequence[str],
        probe: Probe | None,
        *,
        interval_s: float,
        timeout_s: float = 5.0,
        conditions: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        self.servicer = servicer
        self._names = tuple(names)
        self._probe = probe
        self._conditions = conditions  # name -> why the server cannot take calls now
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self.serving: bool | None = None
        self.down: dict[str, str] = {}  # engine -> why, while it is down

    async def start(self) -> None:
        """Check once (the status is right from the first request), then keep watching."""
        await self.check()
        if self._probe is not None or self._conditions is not None:
            self._task = asyncio.get_running_loop().create_task(self._watch(), name="health")

    def poke(self) -> None:
        """Check again now (an engine call failed)."""
        self._wake.set()

    async def check(self) -> bool:
        """Probe once and publish the result; whether the server is SERVING."""
        down: dict[str, str] = {}
        if self._probe is not None:
            try:
                states = await asyncio.wait_for(self._probe(), self._timeout_s)
            except Exception as e:  # a probe that cannot answer counts as down
                states = {"engines": Health(False, f"health probe failed: {type(e).__name__}: {e}")}
            down = {name: h.detail or "down" for name, h in states.items() if not h.ok}
        if self._conditions is not None:
            down.update(self._conditions())
        await self._publish(not down, down)
        return not down

    async def _publish(self, ok: bool, down: dict[str, str]) -> None:
        if self._stopped:
            return
        if ok != self.serving:
            if ok and self.serving is not None:
                logger.info("engines back: health SERVING")
            elif not ok:
                logger.warning("health NOT_SERVING: %s",
                               "; ".join(f"{k}: {v}" for k, v in down.items()))
        self.serving, self.down = ok, down
        for name in self._names:
            await self.servicer.set(name, SERVING if ok else NOT_SERVING)

    async def _watch(self) -> None:
        while not self._stopped:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._interval_s)
            self._wake.clear()
            try:
                await self.check()
            except Exception:  # never let the watcher die; the next round tries again
                logger.exception("health check failed")

    async def stop(self) -> None:
        """Stop watching and pin NOT_SERVING (draining)."""
        self._stopped = True
        if self._task is not None:
            # Python 3.11's asyncio.wait_for can swallow a cancellation that arrives as its
            # inner wait completes (an engine failure poking the watcher during a drain; it hung
            # server shutdowns ~1 run in 3): the watcher also ends on ``_stopped``, and the
            # cancellation is repeated until the task is done
            self._wake.set()
            while not self._task.done():
                self._task.cancel()
                await asyncio.wait({self._task}, timeout=0.1)
            with contextlib.suppress(asyncio.CancelledError):
                self._task.result()
            self._task = None
        self.serving = False
        for name in self._names:
            await self.servicer.set(name, NOT_SERVING)
