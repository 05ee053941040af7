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
want to run, and each task still makes progress in arrival order. While calls are being refused
for load (:func:`hurry`, called by admission control on each refusal), slices are
:data:`IDLE_TURNS` iterations apart, so that the calls waiting in gRPC's queue reach admission
at once instead of one per slice. ``urgent`` waiters (reading
new requests, so that admission control can refuse them quickly, and finishing responses, which
frees capacity) go before the others (fanning out admitted work, the engines).
"""

from __future__ import annotations

import asyncio
import itertools
import time
import weakref
from collections import deque

SLICE_S = 0.002  # CPU time one holder may use before the loop polls its sockets again
IDLE_TURNS = 16  # while hurried: loop iterations with no slice between two slices
HURRY_S = 0.25  # how long one refusal for load hurries the loop (:func:`hurry`)
_MAX_WAKE = 64
_Waiter = tuple[int, "asyncio.Task[object] | None", "asyncio.Future[None]"]


class Turnstile:
    """The time slices of one event loop (see the module doc).

    A slice is shared by the waiters woken together: each release wakes up to ``_wake`` of them
    (in order; adaptive: doubled while a slice's holders finish within it, halved when one runs
    out of it), and the next release comes after they have run. Waking one waiter per release
    let the next release take the slice before the woken task had run, so under load every
    waiter did one unit of work per loop iteration, and the loop's per-iteration cost (polling
    gRPC's sockets) was paid per unit (issue 24: throughput fell past concurrency 64).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, slice_s: float = SLICE_S) -> None:
        self._loop = loop
        self._slice_s = slice_s
        self._idle_left = 0  # iterations still to pass with no slice (while hurried)
        self._hurry_until = 0.0  # loop time until which slices are IDLE_TURNS apart
        self._holders: set[asyncio.Task[object] | None] = set()
        self._slice_start = 0.0
        self._fresh = False  # woken holders have not started the slice's clock yet
        self._checked = False  # the release after a wake-up has waited once for them
        # (arrival ticket, task, future to wake it with); _again is kept in ticket order
        self._waiters: deque[_Waiter] = deque()
        self._urgent: deque[_Waiter] = deque()
        self._again: deque[_Waiter] = deque()
        self._tickets = itertools.count()
        self._release_scheduled = False
        self._wake = 1  # waiters woken per release (adaptive, 1.._MAX_WAKE)
        self._ran_out = False  # a holder of the current slice ran out of it
        self.waits = 0  # times a caller had to wait for a later iteration (tests, benchmarks)

    async def turn(self, *, urgent: bool = False) -> None:
        task = asyncio.current_task()
        now = time.perf_counter()
        if task in self._holders and now - self._slice_start < self._slice_s:
            return
        if not self._holders and not self._waiters and not self._urgent and not self._again:
            self._holders.add(task)
            self._slice_start = now
            self._schedule_release()
            return
        if task in self._holders:
            self._ran_out = True
        ticket = next(self._tickets)
        queue = self._urgent if urgent else self._waiters
        while True:
            fut: asyncio.Future[None] = self._loop.create_future()
            if queue is self._again:  # behind those that came before it, ahead of the others
                i = len(queue)
                while i and queue[i - 1][0] > ticket:
                    i -= 1
                queue.insert(i, (ticket, task, fut))
            else:
                queue.append((ticket, task, fut))
            self.waits += 1
            self._schedule_release()
            await fut  # on wake-up this task shares a fresh slice with the others woken with it
            now = time.perf_counter()
            if self._fresh:
                self._fresh, self._slice_start = False, now
                return
            if now - self._slice_start < self._slice_s or task not in self._holders:
                return
            # the slice was spent by those woken before it: first in line for the next one,
            # where it shares that slice too (it used to start a slice of its own there, so
            # that each of 32 engine batches woken together ran its whole batch, 1.3 ms, in
            # one loop iteration of 40 ms: faults.py 3a, health p99 170-280 ms)
            self._ran_out = True
            self._holders.discard(task)
            queue = self._again

    def _schedule_release(self) -> None:
        if not self._release_scheduled:
            self._release_scheduled = True
            self._loop.call_soon(self._release)  # runs in a later loop iteration

    def _release(self) -> None:
        self._release_scheduled = False
        if self._holders and self._fresh and not self._checked:
            # woken last time, not yet run: let them run first (once; a cancelled one never runs)
            self._checked = self._release_scheduled = True
            self._loop.call_soon(self._release)
            return
        if self._idle_left > 0 and (self._again or self._urgent or self._waiters):
            self._idle_left -= 1  # an iteration with no slice (see hurry)
            self._release_scheduled = True
            self._loop.call_soon(self._release)
            return
        self._checked = self._fresh = False
        self._holders.clear()
        if self._ran_out:
            self._wake = max(1, self._wake // 2)
        elif self._wake < _MAX_WAKE:
            self._wake *= 2
        self._ran_out = False
        n = 0
        for queue in (self._again, self._urgent, self._waiters):
            while queue and n < self._wake:
                _, task, fut = queue.popleft()
                if fut.done():  # the waiter was cancelled
                    continue
                self._holders.add(task)
                fut.set_result(None)
                n += 1
        if n:
            self._idle_left = IDLE_TURNS if self.hurried else 0
            self._fresh = self._release_scheduled = True
            self._loop.call_soon(self._release)  # checks, next iteration, that they have run

    @property
    def hurried(self) -> bool:
        """Whether slices are :data:`IDLE_TURNS` iterations apart now (see :func:`hurry`)."""
        return self._loop.time() < self._hurry_until

    def hurry(self, seconds: float) -> None:
        """For the next ``seconds``, leave :data:`IDLE_TURNS` loop iterations with no slice
        between two slices (see :func:`hurry`)."""
        self._hurry_until = max(self._hurry_until, self._loop.time() + seconds)


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


def hurry(seconds: float = HURRY_S) -> None:
    """Calls are being refused for load: for the next ``seconds`` the running loop turns
    :data:`IDLE_TURNS` times with no slice between two slices, so that gRPC's server takes the
    calls waiting in its queue at once, to be refused (or admitted) by admission control. gRPC
    takes each new call in a chain of about five loop iterations; with a slice in every
    iteration a burst of calls waited there, unseen, for as long as the loop took to finish the
    work admitted before it (bench/faults.py's 8x overload: 32 loops starting at once, refused
    and admitted calls alike at 100-220 ms p99). Only while calls are refused: always on, the
    same idle turns let floods of small calls in faster than admission's limits, which then
    refused them (bench/faults.py's G served a third of its calls). No-op outside a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    turnstile().hurry(seconds)
