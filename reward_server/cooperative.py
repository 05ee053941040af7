"""Bounded CPU work per event-loop iteration, shared by every task of the process.

The gRPC server, the health service and every call share one asyncio loop. asyncio runs all the
callbacks that are ready before it polls sockets again, so a thousand item tasks that each do a
little work in the same iteration delay every other call (health checks included) by the sum.
Code that does CPU work per item (converting, validating, fanning out, building responses, the
fake engines) calls :func:`turn` between units of work:

- while the caller holds the current time slice (``SLICE_S``) and nobody is waiting, it goes on
  at once (no yield, no cost);
- otherwise it waits in a FIFO for a later iteration; one waiter gets a fresh slice per
  iteration, so between two slices the loop polls its sockets and answers other calls.

So the work done through :func:`turn` in one iteration is about one slice, however many tasks
want to run, and each task still makes progress in arrival order. ``urgent`` waiters (reading
new requests, so that admission control can refuse them quickly, and finishing responses, which
frees capacity) go before the others (fanning out admitted work, the engines).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import deque

SLICE_S = 0.002  # CPU time one holder may use before the loop polls its sockets again


class Turnstile:
    """The time slices of one event loop (see the module doc)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, slice_s: float = SLICE_S) -> None:
        self._loop = loop
        self._slice_s = slice_s
        self._holder: asyncio.Task[object] | None = None
        self._slice_start = 0.0
        self._waiters: deque[tuple[asyncio.Task[object] | None, asyncio.Future[None]]] = deque()
        self._urgent: deque[tuple[asyncio.Task[object] | None, asyncio.Future[None]]] = deque()
        self._release_scheduled = False
        self.waits = 0  # times a caller had to wait for a later iteration (tests, benchmarks)

    async def turn(self, *, urgent: bool = False) -> None:
        task = asyncio.current_task()
        now = time.perf_counter()
        if self._holder is task and now - self._slice_start < self._slice_s:
            return
        if self._holder is None and not self._waiters and not self._urgent:
            self._take(task, now)
            return
        fut: asyncio.Future[None] = self._loop.create_future()
        (self._urgent if urgent else self._waiters).append((task, fut))
        self.waits += 1
        self._schedule_release()
        await fut  # on wake-up this task holds a fresh slice

    def _take(self, task: asyncio.Task[object] | None, now: float) -> None:
        self._holder = task
        self._slice_start = now
        self._schedule_release()

    def _schedule_release(self) -> None:
        if not self._release_scheduled:
            self._release_scheduled = True
            self._loop.call_soon(self._release)  # runs in a later loop iteration

    def _release(self) -> None:
        self._release_scheduled = False
        self._holder = None
        for queue in (self._urgent, self._waiters):
            while queue:
                task, fut = queue.popleft()
                if fut.done():  # the waiter was cancelled
                    continue
                self._take(task, time.perf_counter())
                fut.set_result(None)
                return


_TURNSTILES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Turnstile] = (
    weakref.WeakKeyDictionary()
)


def turnstile() -> Turnstile:
    """The running loop's turnstile."""
    loop = asyncio.get_running_loop()
    t = _TURNSTILES.get(loop)
    if t is None:
        t = _TURNSTILES[loop] = Turnstile(loop)
    return t


async def turn(*, urgent: bool = False) -> None:
    """Go on if this task still holds the loop's time slice, else wait for a later iteration
    (``urgent``: ahead of the waiters that are not)."""
    await turnstile().turn(urgent=urgent)
