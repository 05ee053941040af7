"""Give freed heap memory back to the operating system after large requests or responses.

glibc's malloc keeps freed memory in its arenas (gRPC's threads each have one) instead of
returning it, so after a burst of large messages the server's RSS stays near its peak although
the memory is free: 1 GB was measured still held after non-reading peers had gone. ``malloc_trim``
returns what is free; :class:`Trimmer` calls it, in a worker thread, once enough bytes were
freed and no trim is running, a moment after the call that freed them has ended (its bytes are
let go only with its handler's frames; trimming inside the call, as first done, ran before they
were). A no-op where libc has no ``malloc_trim``.

A call that does much work (65,536 judgments) frees hundreds of thousands of small objects
too; with Python's own small-object allocator those stay in its 1 MiB arenas, which it gives
back only when they are entirely empty: the few objects that outlive the call (a few hundred,
tracemalloc) keep arenas it filled. 66 -> 113 MB after three such calls, 66 -> 86 MB since the
judge prompts share their prefix, suffix and rule strings (fewer arenas filled; measured).
``PYTHONMALLOC=malloc`` in the server's environment puts them in glibc's heap, which the
trim after calls that moved at least ``TRIM_IDLE_BYTES`` (:meth:`Trimmer.idle`) returns
(64 -> 73 MB after the same calls), but it is not the default: it cost the server 35-44 % more
CPU per item (bench/scaling.py, docs/performance.md), so it is the operator's choice.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger(__name__)
TRIM_AFTER_BYTES = 32 * 1024 * 1024  # freed since the last trim
TRIM_IDLE_BYTES = 1024 * 1024  # ... or this many, once no call is in flight
MIN_INTERVAL_S = 1.0
DELAY_S = 0.2  # after the call that crossed the threshold, so that its frames are gone
WATCH_S = 0.5  # how often an idle server looks at its RSS (Trimmer.watch). At 2 s what gRPC's
# refused 52 MB messages left could still be resident 2 s after them (bench/faults.py, one full
# run each: 3b 93 -> 110 MB at 2 s, 92 -> 94 at 0.5 s); a look costs ~20 us (RSS, mallinfo2)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _libc_function(name: str) -> Any:
    """The C library's function ``name``, or None where it (or the library) is not there."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None


def _heap_free() -> Callable[[], int] | None:
    """glibc's free bytes in its arenas (``mallinfo2().fordblks``; glibc >= 2.33), or None."""
    info = _libc_function("mallinfo2")
    if info is None:
        return None
    info.argtypes, info.restype = [], _MallInfo2
    return lambda: int(info().fordblks)


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)


def fix_mmap_threshold(nbytes: int | None) -> bool:
    """Serve allocations of ``nbytes`` or more from their own mapping, returned to the system
    when freed (glibc's ``M_MMAP_THRESHOLD``; a free block of the heap large enough is still
    reused first). By default glibc starts at 128 KiB and raises the
    threshold to the size of each mapped block freed, up to 32 MiB: after one large message,
    buffers of up to its size come from the arenas, where freed memory stays resident until a
    trim, and a trim cannot return pages still shared with live small blocks. Fixing the
    threshold (which also stops that adjustment) keeps large buffers out of the arenas. None:
    leave glibc's behaviour. Returns whether it was set (False where libc has no ``mallopt``)."""
    if nbytes is None:
        return False
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = bool(mallopt(M_MMAP_THRESHOLD, nbytes))
    if not ok:
        logger.warning("mallopt(M_MMAP_THRESHOLD, %d) failed; large buffers may stay resident "
                       "after use (server.malloc_mmap_threshold_bytes)", nbytes)
    return ok


TCACHE_TUNABLE = "glibc.malloc.tcache_count"


def tcache_env(environ: Mapping[str, str], count: int | None) -> dict[str, str] | None:
    """The environment to start this process again with so that glibc keeps at most ``count``
    freed chunks per size in each thread's cache (``GLIBC_TUNABLES``, read only when a process
    starts), or None when there is nothing to change: ``count`` is None, the C library is not
    glibc, or ``GLIBC_TUNABLES`` names the tunable already (the operator's value wins, and the
    process started again finds it there, so it never restarts twice).

    Why: those cached chunks are neither returned by ``malloc_trim`` nor reused by other
    threads, and after a flood each of gRPC core's threads holds up to 7 of each of 64 sizes,
    scattered over pages that are otherwise free, so the pages stay resident (bench/faults.py,
    rapid reset on a fresh server: RSS after +5.0 to +11.1 % without the cache, +13.6 to
    +16.3 % with glibc's 7; docs/performance-log.md)."""
    if count is None or not _is_glibc():
        return None
    current = environ.get("GLIBC_TUNABLES", "")
    if any(part.split("=", 1)[0] == TCACHE_TUNABLE for part in current.split(":")):
        return None
    env = dict(environ)
    env["GLIBC_TUNABLES"] = ":".join(p for p in (current, f"{TCACHE_TUNABLE}={count}") if p)
    return env


def _is_glibc() -> bool:
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (ValueError, OSError, AttributeError):  # not a name this platform knows
        return False


def _malloc_trim() -> Callable[[int], int] | None:
    trim = _libc_function("malloc_trim")
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda pad: int(trim(pad))


class Trimmer:
    """Counts freed message bytes; trims the heap after ``TRIM_AFTER_BYTES`` of them."""

    def __init__(self, after_bytes: int = TRIM_AFTER_BYTES, *,
                 busy: Callable[[], bool] = lambda: False) -> None:
        """``busy``: whether calls are in flight (an idle trim asked for while another trim
        was under way runs after it only when not)."""
        self._trim = _malloc_trim()
        self._busy = busy
        self._again = False  # idle() was asked while a trim was scheduled or running
        self._after = after_bytes
        self._freed = 0
        self._last = 0.0
        self._scheduled = False
        self._running = False  # a collection and trim under way
        self._moved = 0  # bytes freed since the last idle collection
        # the rest level: the RSS and glibc's free bytes the last idle trim left. A trim under
        # load leaves them alone: it ran with the calls' memory still in use, and as the level
        # it hid what those calls left behind (bench/faults.py's B: a trim during the attack
        # left 85 MB, 1.5 MB above the level after it, so the idle server never trimmed again)
        self._floor = _rss()
        self._heap_free = _heap_free()
        self._free_floor = self._free_now()
        self._rest = self._floor  # the lowest RSS an idle trim left (or the RSS at the start)
        self.trims = 0

    def freed(self, nbytes: int) -> None:
        """``nbytes`` of a message were let go (call from the event loop)."""
        self._freed += nbytes
        self._moved += nbytes
        if self._trim is None or self._freed < self._after or self._scheduled:
            return
        self._scheduled = True
        wait = max(DELAY_S, MIN_INTERVAL_S - (time.monotonic() - self._last))
        asyncio.get_running_loop().call_later(wait, self._start)

    def _free_now(self) -> int:
        return self._heap_free() if self._heap_free is not None else 0

    def idle(self) -> None:
        """No call is in flight now: trim if calls moved ``TRIM_IDLE_BYTES`` since the last
        idle trim, or the RSS grew 8 MiB (or 5 %) past what the last idle trim left (gRPC's own
        buffers: a message it refused as too large never reaches us), or glibc holds 8 MiB
        more free bytes than the last idle trim left (gRPC's state of connections that closed
        since: 1,100 idle connections left 23 MB free and resident; call from the event
        loop); or the RSS is 8 MiB (or 5 %) above the lowest an idle trim left and has moved
        by ``TRIM_IDLE_BYTES`` since the last idle trim (memory let go after that trim:
        bench/faults.py's B, whose streams' memory was still in use at the first idle trim
        after the attack, was left +13-19 % in 3 of 5 runs without this, and +7-8 % trimmed
        every second; glibc's count of free bytes did not show it, as it counts a free chunk
        the same whether its pages were given back or used and freed again since)."""
        if self._trim is None:
            return
        if self._scheduled or self._running:  # one at a time (the RSS it leaves is the next
            self._again = True  # comparison's floor): looked at again when it is done
            return
        if self._moved < TRIM_IDLE_BYTES and not self._grew_idle():
            return
        self._scheduled = True
        wait = max(DELAY_S, MIN_INTERVAL_S - (time.monotonic() - self._last))
        asyncio.get_running_loop().call_later(wait, self._start, True)

    def _grew_idle(self) -> bool:
        """Whether the RSS or glibc's free bytes moved enough since the last idle trim (see
        :meth:`idle`); glibc's count (which walks every arena) only when the RSS did not."""
        rss = _rss()
        if rss >= self._floor + _margin(self._floor):
            return True
        if rss >= self._rest + _margin(self._rest) and abs(rss - self._floor) >= TRIM_IDLE_BYTES:
            return True
        return self._free_now() >= self._free_floor + 8 * TRIM_IDLE_BYTES

    async def watch(self, busy: Callable[[], bool], every_s: float = WATCH_S) -> None:
        """Run :meth:`idle` every ``every_s`` while ``busy()`` is false (until cancelled):
        memory that grew without a call ending (connections that never made one; an HTTP body
        refused while it was read) is given back too, not only after the next call."""
        while True:
            await asyncio.sleep(every_s)
            if not busy():
                self.idle()

    def _start(self, idle: bool = False) -> None:
        self._scheduled = False
        if self._running or self._trim is None:
            logger.debug("trim skipped: one is running; looked at again when it is done")
            self._again = True
            return
        if idle and self._busy():
            # idle when asked for, busy again now: its full collection would hold the event
            # loop under the calls in flight (under closed-loop load the server is idle for a
            # moment between calls: bench/faults.py's overload ran one a second, 2-25 ms
            # each). The end of the last call in flight asks again.
            logger.debug("idle trim skipped: calls are in flight again")
            return
        self._freed = 0
        self._last = time.monotonic()
        self.trims += 1
        if idle:
            # gRPC's request iterator and its generator, which holds the call's last message,
            # form a reference cycle that outlives the call into the oldest generation:
            # collect it (the generator is closed by a task the loop runs next), then trim;
            # only when idle (a full collection while many calls are in flight held the loop)
            self._moved = 0
            gc.collect()
        self._running = True
        asyncio.get_running_loop().call_later(DELAY_S, self._trim_now, idle)

    def _trim_now(self, idle: bool) -> None:
        assert self._trim is not None
        trimmed = asyncio.get_running_loop().run_in_executor(None, self._trim, 0)
        trimmed.add_done_callback(lambda fut: self._done(fut, idle))

    def _done(self, fut: asyncio.Future[int], idle: bool) -> None:
        self._running = False
        rss = _rss()
        if idle:  # the new rest level (see __init__)
            self._floor = rss
            self._free_floor = self._free_now()
            self._rest = min(self._rest, rss)
        logger.debug("trimmed the heap (trim %d, %s): RSS now %.0f MB", self.trims,
                     "idle" if idle else "under load", rss / 1e6)
        if not fut.cancelled() and fut.exception() is not None:
            logger.warning("malloc_trim failed: %s", fut.exception())
        if self._again and not self._busy():
            # an idle trim asked for meanwhile (a large HTTP body's call ending while the trim
            # its bytes scheduled ran): without this it waited for the watch, up to WATCH_S
            self._again = False
            self.idle()


def _margin(level: int) -> int:
    """How far the RSS may rise past ``level`` before an idle server trims: 8 MiB or 5 %."""
    return max(8 * TRIM_IDLE_BYTES, level // 20)


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss() -> int:
    """This process's resident bytes (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0
