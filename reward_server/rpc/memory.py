"""Give freed heap memory back to the operating system after large requests or responses.

glibc's malloc keeps freed memory in its arenas (gRPC's threads each have one) instead of
returning it, so after a burst of large messages the server's RSS stays near its peak although
the memory is free: 1 GB was measured still held after non-reading peers had gone. ``malloc_trim``
returns what is free; :class:`Trimmer` calls it, in a worker thread, once enough bytes were
freed and no trim is running, a moment after the call that freed them has ended (its bytes are
let go only with its handler's frames; trimming inside the call, as first done, ran before they
were). A no-op where libc has no ``malloc_trim``.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)
TRIM_AFTER_BYTES = 32 * 1024 * 1024  # freed since the last trim
MIN_INTERVAL_S = 1.0
DELAY_S = 0.2  # after the call that crossed the threshold, so that its frames are gone


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


class Trimmer:
    """Counts freed message bytes; trims the heap after ``TRIM_AFTER_BYTES`` of them."""

    def __init__(self, after_bytes: int = TRIM_AFTER_BYTES) -> None:
        self._trim = _malloc_trim()
        self._after = after_bytes
        self._freed = 0
        self._last = 0.0
        self._scheduled = False
        self._running: asyncio.Future[int] | None = None
        self.trims = 0

    def freed(self, nbytes: int) -> None:
        """``nbytes`` of a message were let go (call from the event loop)."""
        self._freed += nbytes
        if self._trim is None or self._freed < self._after or self._scheduled:
            return
        self._scheduled = True
        wait = max(DELAY_S, MIN_INTERVAL_S - (time.monotonic() - self._last))
        asyncio.get_running_loop().call_later(wait, self._start)

    def _start(self) -> None:
        self._scheduled = False
        if self._running is not None or self._trim is None:  # the next free schedules again
            return
        self._freed = 0
        self._last = time.monotonic()
        self.trims += 1
        self._running = asyncio.get_running_loop().run_in_executor(None, self._trim, 0)
        self._running.add_done_callback(self._done)

    def _done(self, fut: asyncio.Future[int]) -> None:
        self._running = None
        if not fut.cancelled() and fut.exception() is not None:
            logger.warning("malloc_trim failed: %s", fut.exception())
