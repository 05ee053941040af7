"""The measurements behind :mod:`reward_server.service.admission`'s adaptive limits and retry hints.

* :class:`Window`: work completed, busy time and refusals over a short window (the throughput
  Little's law sizes the limits from).
* :class:`LoopLoad`: how busy the thread that serves the calls (the event loop) was over the same
  window, from its CPU time. A gRPC server in Python accepts one new call per turn of its event
  loop, so when that loop is saturated calls queue in the transport before any handler sees them:
  latency measured from the handler's start stays low while callers wait. Admitting more then
  adds only waiting, so the limits do not grow while the loop is saturated.
* :class:`AloneLatency`: how long a call takes when it runs alone, by its size: the default
  latency target is twice that of a call of the usual size.
* :class:`RetryLine`: the retry hint given to refused calls, a virtual waiting line. Each refused
  call is told to come back at the next free place in a line that moves as fast as calls complete
  (times ``per_completed``), so N refused callers spread their retries over about N completions
  instead of all coming back after one call's duration and hammering the ingress (each refusal
  costs the loop some CPU too). Nothing is held for them: a caller that does not come back costs
  nothing, and the line empties as time passes. Hints are at most ``most_s``: places further
  down the line are spread over its second half.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


def between(x: float, lo: int, hi: int | None) -> int:
    return max(lo, min(round(x), hi if hi is not None else round(x)))


class Window:
    """Work completed, busy time (some call held) and calls the limits held back, since
    ``start``."""

    def __init__(self, start: float, *, busy_since: float = 0.0) -> None:
        self.start = start
        self.busy_since = busy_since or start
        self.busy_s = 0.0
        self.judgments = 0
        self.nli = 0  # of ``judgments``, NLI pairs
        self.calls = 0
        self.took_s = 0.0
        self.short = {"judgments": 0, "calls": 0}  # calls refused or kept waiting, per limit
        self.peak_judgments = 0  # the most held at once

    def held(self, judgments: int) -> None:
        """What is held now (after a change): the window's peak follows it."""
        self.peak_judgments = max(self.peak_judgments, judgments)

    def idle(self, now: float) -> None:
        self.busy_s += now - max(self.busy_since, self.start)

    def done(self, judgments: int, took_s: float, *, nli: int = 0) -> None:
        self.judgments += judgments
        self.nli += nli
        self.calls += 1
        self.took_s += took_s


class LoopLoad:
    """The fraction of wall time the calling thread spent on its CPU between two
    :meth:`sample` calls (1.0: saturated). Samples from another thread than the last are
    ignored (None), as is the first."""

    def __init__(self, cpu_clock: Callable[[], float] = time.thread_time) -> None:
        self._cpu = cpu_clock
        self._last: tuple[int, float, float] | None = None

    def sample(self, now: float) -> float | None:
        me, cpu = threading.get_ident(), self._cpu()
        last, self._last = self._last, (me, now, cpu)
        if last is None or last[0] != me or now <= last[1]:
            return None
        return (cpu - last[2]) / (now - last[1])


class AloneLatency:
    """A call's latency when it ran alone, as a moving average per size class (judgments, in
    powers of two). One average over all sizes kept what the last calls of another size
    measured: after 1,024 concurrent 1-item calls (1 ms alone) a server serving 128-judgment
    calls (about 5 ms alone) aimed at 2 ms and its loop never counted as one to shed for
    (bench/faults.py, the overload after attack G: the limit stayed at its floor)."""

    def __init__(self, ewma: float) -> None:
        self._ewma = ewma
        self._by_size: dict[int, float] = {}

    @staticmethod
    def _size(judgments: float) -> int:
        return max(0, int(judgments).bit_length() - 1)

    def observe(self, judgments: int, took_s: float) -> None:
        k = self._size(judgments)
        old = self._by_size.get(k)
        self._by_size[k] = took_s if old is None else old + self._ewma * (took_s - old)

    def at(self, judgments: float) -> float | None:
        """The latency alone of a call of ``judgments`` (of the nearest size measured; None:
        nothing measured)."""
        if not self._by_size:
            return None
        k = self._size(judgments)
        return self._by_size[min(self._by_size, key=lambda m: (abs(m - k), -m))]


class RetryLine:
    """Retry hints that spread refused callers over time (see the module's docstring)."""

    def __init__(self, *, least_s: float, most_s: float) -> None:
        self.least_s, self.most_s = least_s, most_s
        self._free_at = 0.0  # the line's next free place (clock time)

    def hint(self, now: float, *, least_s: float, per_s: float | None) -> float:
        """Seconds the caller refused at ``now`` should wait: at least ``least_s`` (about one
        call's duration), and after the callers refused before it, spaced ``1 / per_s``
        (``per_s``: the rate at which refused callers can expect room; None: not measured)."""
        least = min(self.most_s, max(self.least_s, least_s))
        at = max(now + least, self._free_at)
        if per_s is not None and per_s > 0:
            self._free_at = at + 1.0 / per_s
        wait = at - now
        if wait > self.most_s:  # a line longer than the longest hint: places past it wrap
            half = self.most_s / 2  # around into its second half, so they do not all come
            wait = half + (wait - half) % half  # back at once when told the longest
        return wait
