"""How :mod:`reward_server.service.admission`'s adaptive limits are sized at the end of each window.

By Little's law the work in flight is throughput times latency, so the judgment limit is the
measured throughput (:class:`Rates`: the judgments admitted calls complete per busy second, an
EWMA) times the latency target, divided by :data:`P99_OVER_MEAN` because the target is a p99
and the law gives a mean; the call limit the same with calls per second (:func:`new_limits`).
Each stays between a floor and a cap. When the engines are faster than the work admitted,
latency stays under the target and a limit that held calls back grows by a quarter; when they
slow down, it shrinks. A limit that held nothing back in a window comes down to :data:`UNUSED`
times the most held in it (room nobody asked for; the judgment limit only: the call limit's
floor is a few calls), and the rates restart when the calls' mean size changes
:data:`RATE_SIZE_CHANGE`-fold. A window too idle to measure the throughput in puts the judgment
limit back at its floor.

The judgment limit does not grow while the event loop is saturated (:data:`SATURATED`): gRPC's
Python server accepts one call per turn of the loop, so calls then wait in the transport, before
the handler where latency is measured (:class:`~reward_server.service._limiter.LoopLoad`), for
calls that take at least :data:`SHED_MIN_ALONE_S` alone. Saturated and refusing calls for lack of
room (overloaded: a loop merely busy with the callers' own work, as in a test, refuses nothing at
the floor), the judgment limit goes to Little's law, under its floor down to one usual call, and
stays under it while calls are still refused and the loop stays over :data:`SHED_RELEASE`
(shedding itself lowers the loop's load); with the loop under that, or nothing refused, it
returns to the floor at once. Saturated without refusals it is held where it is.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from reward_server.service._limiter import Window, between

logger = logging.getLogger("reward_server.service.admission")  # where these lines have been

_RATE_EWMA = 0.5  # throughput: quick, so the limit grows within seconds when the engines can
WINDOW_S = 0.5  # the throughput is measured over windows of this length ...
_MIN_BUSY = 0.2  # ... in which work was in flight at least this fraction of the time
P99_OVER_MEAN = 1.5  # latency target (a p99) over the mean latency Little's law sizes for
SATURATED = 0.85  # the event loop's CPU share past which the judgment limit does not grow ...
# ... and once under its floor (shedding), the share it stays there above while calls are still
# refused: shedding lowers the loop's load, and with one threshold the limit went back to the
# floor in the next window and under it in the one after (bench/faults.py at 8x, a log of each
# resize: loop CPU 0.77-0.98, the limit 512, 174, 160, 512, 193, 186, 512)
SHED_RELEASE = 0.6
# a window in which no call was held back for a limit brings that limit down to this many times
# the most held at once in it (never under its floor): bench/faults.py's overload after the large
# requests (3a) began with the limit at its cap, 32,768, and admitted the whole burst
UNUSED = 2
# a window whose calls average this many times more (or fewer) judgments than those the rates
# were measured on restarts them: after attack 3a's large calls the inflated judgments per second
# kept Little's law over the small calls' limit for seconds (bench/faults.py --only big, then an
# overload: the shed limit 512, 395, 361, 346, 321, 297, 272 a window apart)
RATE_SIZE_CHANGE = 4.0
SHED_MIN_ALONE_S = 0.005  # ... when a usual call takes this long alone (a refusal costs the loop
# about 1-2 ms: refusing calls cheaper than a few refusals moves their cost, it does not shed it).
# 3 ms was tried twice (bench/faults.py --only overload, 128-judgment calls of ~5 ms alone):
# with the call-state cycles gone, three interleaved runs each served 649-748 calls at 2x
# overload against 884-928 at 5 ms, with no lower p99 (24.5-42.6 ms against 11.5-36.8)


def mix_floor(batches: tuple[int, int], used: tuple[bool, bool], most: int) -> int:
    """The judgment limit's floor for calls that used the judge and / or the NLI engine
    (``used``), when one full batch of the judge holds ``batches[0]`` items and one of a
    separate NLI engine ``batches[1]``: one full batch of every engine the calls use, at most
    ``most`` (the floor when the mix is not known). Calls that use both engines (verl's merged
    calls: half and half) get both batches; calls that use one, that one's batch. Counted as
    both batches whatever the mix, calls of judge prompts only were let in two judge batches
    deep (bench/faults.py's overload, 128-prompt calls: 4 at the floor of 512, admitted p99 3-6x
    the unloaded one; docs/performance-log.md)."""
    return max(1, min(most, sum(b for b, u in zip(batches, used, strict=True) if u)))


class Rates:
    """Throughput per busy second: judgments and calls completed (EWMAs; None until a window
    was busy enough to measure it)."""

    def __init__(self) -> None:
        self.judgments_per_s: float | None = None
        self.calls_per_s: float | None = None
        self._size = 0.0  # the mean call size (judgments) of the window the rates restarted in

    def update(self, w: Window, *, busy_s: float, span_s: float) -> bool:
        """Blend in window ``w`` (``busy_s`` of its ``span_s`` with work in flight), if it was
        busy enough and completed calls; whether it was."""
        if busy_s < _MIN_BUSY * span_s or not w.calls:
            return False
        size = w.judgments / w.calls
        # calls of another size: the old rate is not theirs (a call of 65,536 judgments
        # runs at several times the judgments per second of one of 128), so not blended in
        fresh = not self._size or not 1 / RATE_SIZE_CHANGE < size / self._size < RATE_SIZE_CHANGE
        if fresh:
            self._size = max(size, 1.0)
        for name, rate in (("judgments_per_s", w.judgments / busy_s),
                           ("calls_per_s", w.calls / busy_s)):
            old = getattr(self, name)
            setattr(self, name, rate if old is None or fresh else old + _RATE_EWMA * (rate - old))
        return True


@dataclass(frozen=True)
class Range:
    """A limit's floor and cap (None: no cap)."""

    floor: int
    cap: int | None


# An idle window (work in flight less than _MIN_BUSY of its time) measures no throughput,
# and Little's law with the rates of calls before it (of another size, or another load) kept a
# limit grown on them: after attack 3's calls of 65,536 judgments and an idle while, one
# refused call (with the loop 7 % busy) grew the limit 512 -> 1,024, and the 2x overload after
# it began at 768 (3,884 in a full run) and admitted everything for its first window. Such a
# window sets the judgment limit back to its floor; the next busy window sizes it again.
def new_limits(
    w: Window, *, limits: tuple[int, int], rates: Rates, target_s: float, loop_busy: float | None,
    alone_s: float | None, usual: int, judgments: Range, calls: Range, measured: bool = True,
) -> tuple[int, int]:
    """The (judgment, call) limits after window ``w``, from the ones in force (``limits``), the
    measured ``rates``, the latency target, the event loop's CPU share in the window
    (``loop_busy``) and a usual call's latency alone and size in judgments (``usual``). Under
    the target (the window's mean latency times P99_OVER_MEAN) a limit that held calls back grows
    by a quarter, probing for what the engines can do at once; over it, each limit is set to
    Little's law: throughput x target / P99_OVER_MEAN. A window too idle to measure the
    throughput in (``measured`` False: ``rates`` are an earlier window's) puts the judgment
    limit back at its floor (see the comment above)."""
    assert rates.judgments_per_s is not None and rates.calls_per_s is not None
    max_judgments = limits[0]
    if not measured:
        return judgments.floor, limits[1]
    # the loop's load, counted only for calls long enough alone to be worth shedding; saturated,
    # calls wait in the transport, unseen by the latency measured here
    loop = loop_busy if (alone_s or 0.0) >= SHED_MIN_ALONE_S else None
    saturated = loop is not None and loop >= SATURATED
    fast = w.took_s / w.calls * P99_OVER_MEAN <= target_s
    usual = max(1, usual)
    # overloaded, not just busy: saturated AND calls refused for lack of room (a loop
    # busy with the callers' own work, as in a test, refuses nothing at the floor). Only
    # then may the judgment limit go under its floor, to Little's law down to one usual
    # call: with the ingress the bottleneck a fuller engine batch buys nothing, and every
    # call admitted beyond that only waits. Back at the floor at once when the loop is
    # under SHED_RELEASE or nothing was refused (between it and SATURATED: held under it).
    threshold = SHED_RELEASE if max_judgments < judgments.floor else SATURATED
    shed = loop is not None and loop >= threshold and sum(w.short.values()) > 0
    out = []
    for limit, rate, short, step, lo, hi, grow, shedding, peak in (
        (max_judgments, rates.judgments_per_s, w.short["judgments"], usual,
         min(usual, judgments.floor) if shed else judgments.floor,
         judgments.cap, not saturated, shed, w.peak_judgments),
        # the call limit keeps what it grew to: its floor is a few calls, and a trainer's
        # per-sample callers come in bursts (a step's rollouts) that would meet it each time
        (limits[1], rates.calls_per_s, w.short["calls"], 1, calls.floor,
         calls.cap, True, False, None),
    ):
        little = rate * target_s / P99_OVER_MEAN
        if shedding:  # the judgment limit only
            new = between(min(little, limit), lo, hi)
        elif fast and short and grow:  # more was asked than the limit let in, latency allows
            new = between(max(little, limit + max(step, limit / 4)), lo, hi)
        elif fast:  # saturated but nothing refused: held where it is (shrinking it on a
            new = max(limit, lo)  # loop busy with the callers' own work refused
        else:  # a second concurrent call)
            new = between(min(little, limit), lo, hi)
        if peak is not None and not short and new > UNUSED * peak:
            # room nobody asked for: down to what was used, so that a limit grown on other
            # work (a few calls of 65,536 judgments, run alone, set the target to seconds and
            # the limit to its cap) does not admit the next burst of small calls unbounded
            new = between(UNUSED * peak, lo, hi)
        out.append(new)
    return out[0], out[1]


# a body holds its estimated judgments (its size over the admitted calls' bytes per judgment)
# before it is parsed only when that is at least this many usual calls; a body about the usual
# size holds a usual call's. The bytes per judgment vary from call to call by a few per cent (ids
# and texts of other lengths): verl's merged calls of 128 judgments were estimated at 129-130,
# four of them then did not fit the floor of 512 that their callers' whole demand fills, and the
# refusal on a saturated loop shed the limit (bench/microbatch.py: 4 runs of 8 went so, each
# starting with that refusal; 171-333 refusals, 4,753-5,809 items/s against 6,447-8,054)
LARGE_BODY = 2.0


def usual_size(usual: float, judgments: int, ewma: float) -> float:
    """The usual call's judgments after one more admitted call: a moving average of the calls'
    sizes on a log scale (a geometric mean), so that a few calls far larger than the rest move it
    by a factor, not to their size. Averaged linearly, three calls of 65,536 judgments (attack 3a)
    among calls of 128 set it near 32,000, and the 4-judgment calls that followed for seconds left it
    in the thousands: the next calls of 128 were each held as a "usual" 512 before being read (so
    one at a time under the floor of 512) and refused callers were spaced by calls of that size;
    bench/faults.py's 2x overload after them served 74, 305 and 331 calls in 3 s in three runs
    (7-8 refused: the loops slept on long pushbacks), 316, 360 and 320 with this average."""
    size = float(max(judgments, 1))
    return usual ** (1 - ewma) * size ** ewma if usual else size


def log_window(w: Window, now: float, *, rates: Rates, loop_busy: float | None, target_s: float,
               limits: tuple[tuple[int, int], tuple[int, int]]) -> None:
    """At DEBUG: a window's calls, refusals, peak, loop load, rates and the limits it left."""
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "admission window of %.2f s: %d calls, %d judgments, refused or kept waiting %s, "
            "peak %d judgments, loop busy %s, rates %.0f judgments/s %.0f calls/s, target "
            "%.1f ms; limits %s -> %s", now - w.start, w.calls, w.judgments, w.short,
            w.peak_judgments, "?" if loop_busy is None else f"{loop_busy:.2f}",
            rates.judgments_per_s or 0.0, rates.calls_per_s or 0.0, 1000 * target_s, *limits)
