"""The limits of :mod:`reward_server.service.admission` and the work held against them.

:class:`Limits` keeps what admitted calls hold (judgments, calls, request bytes), decides what
fits and words a refusal (with its retry hint), and does the accounting of a call's three steps
(:mod:`reward_server.service._ticket`): its request's bytes, its judgments once parsed, its end,
which measures the throughput and, when adaptive, resizes the limits at the end of each window
(:mod:`reward_server.service._sizing`). Room freed goes to the calls waiting in line
(:mod:`reward_server.service._waiting`). How a call arrives (admitted at once, waiting in line,
or refused at once) is :class:`~reward_server.service.admission.Admission`'s.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from reward_server import cooperative, metrics
from reward_server.errors import Overloaded
from reward_server.service._limiter import AloneLatency, LoopLoad, RetryLine, Window
from reward_server.service._sizing import (
    LARGE_BODY,
    WINDOW_S,
    Range,
    Rates,
    log_window,
    mix_floor,
    new_limits,
    usual_size,
)
from reward_server.service._ticket import Ticket
from reward_server.service._waiting import WaitingRoom

logger = logging.getLogger(__name__)

_RETRY_MIN_S = 0.05
_RETRY_MAX_S = 5.0
_EWMA = 0.2
_ALONE_FACTOR = 2.0  # target_p99_s None: this times a usual call's latency alone
# refused callers are told to come back this fast per completed call (bench/faults.py at 8x:
# 1.0 doubled the refusals and the served p99; lower starves closed-loop callers)
RETRIES_PER_COMPLETED = 0.5


class Limits:
    """The limits of one server and the work admitted now."""

    def __init__(
        self,
        *,
        max_judgments: int | None,
        max_bytes: int | None,
        max_calls: int | None = None,
        adaptive: bool = False,
        min_judgments: int = 1,
        min_calls: int = 1,
        target_s: float | None = None,
        max_wait_s: float | None = 0.0,
        max_waiting: int = 0,
        batches: tuple[int, int] | None = None,
        seed: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self.cap_judgments, self.cap_calls = max_judgments, max_calls
        self.min_judgments = min(min_judgments, max_judgments or min_judgments)
        self.min_calls = min(min_calls, max_calls or min_calls)
        self.adaptive, self.target_s = adaptive, target_s
        self.max_judgments = self.min_judgments if adaptive else max_judgments  # the limits now
        self.max_calls = self.min_calls if adaptive else max_calls
        self.max_bytes = max_bytes
        self._room = WaitingRoom(max_wait_s=max_wait_s, max_waiting=max_waiting)
        self.judgments = 0  # held: admitted calls' judgments, and entering calls' provisional
        self.estimated = 0  # of those: large bodies' estimates past a usual call, until parsed
        self.calls = 0
        self.bytes = 0
        self.refused = 0
        self._call_s = 0.2  # moving average of admitted calls' duration, from their arrival
        self._served_s = 0.0  # ... from their admission (how long a call takes once admitted)
        self._line = RetryLine(least_s=_RETRY_MIN_S, most_s=_RETRY_MAX_S)
        self._loop_load = LoopLoad(cpu_clock)
        self.loop_busy: float | None = None  # the event loop's CPU share, last window
        self._call_judgments = 0.0  # the usual call: admitted calls' judgments (_usual_size)
        self._bytes_per_judgment = 0.0  # moving average over admitted calls (0: none yet)
        self._alone = AloneLatency(_EWMA)  # calls' latency alone, by size
        self._rates = Rates()
        self._clock = clock
        self._admitted = 0  # calls admitted so far
        self._window = Window(clock())
        self._rng = random.Random(seed)
        # (judge, NLI) items of one full batch of each engine: with adaptive limits the
        # judgment floor follows the engines the last window's calls used (None: min_judgments)
        self._batches = batches
        self._used: tuple[bool, bool] | None = None  # (judge, NLI) used by the last window

    @property
    def floor(self) -> int:
        """The judgment limit's floor now: ``min_judgments``, or with the engines' batches
        given, one full batch of every engine the last window's calls used
        (:func:`~reward_server.service._sizing.mix_floor`)."""
        if self._batches is None or self._used is None:
            return self.min_judgments
        return mix_floor(self._batches, self._used, self.min_judgments)

    def retry_after_s(self) -> float:
        """How long a refused caller should wait: about one call's duration (jittered), and
        behind the callers refused before it (:class:`RetryLine`), spaced by the rate at which
        calls of the usual size complete (the judgments per second over their judgments: the
        calls per second measured last may be of calls of another size)."""
        if self.judgments_per_s is not None and self._call_judgments >= 1:
            per_s: float | None = self.judgments_per_s / self._call_judgments * RETRIES_PER_COMPLETED
        else:
            per_s = None if self.calls_per_s is None else self.calls_per_s * RETRIES_PER_COMPLETED
        return self._line.hint(self._clock(), least_s=self._call_s * self._rng.uniform(0.5, 1.5),
                               per_s=per_s)

    @property
    def alone_s(self) -> float | None:
        """A call of the usual size: its latency alone (None: not measured yet)."""
        return self._alone.at(self._call_judgments)

    def target(self) -> float | None:
        """The latency the adaptive limits aim for (None: not measured yet)."""
        if self.target_s is not None:
            return self.target_s
        alone = self.alone_s
        return None if alone is None else _ALONE_FACTOR * alone

    def _refuse(self, what: str, limit: str, stage: str) -> Overloaded:
        self.refused += 1
        metrics.observe_refusal(limit, stage)
        cooperative.hurry()  # more calls are likely waiting in the transport: take them now
        wait = self.retry_after_s()
        return Overloaded(
            f"the server is at its admission limit: {what}; retry in about {wait * 1000:.0f} ms "
            "(grpc-retry-pushback-ms) or send smaller calls", retry_after_s=wait
        )

    def _fits(self, held: int, more: int) -> bool:
        return self.max_judgments is None or not held or held + more <= self.max_judgments

    def _full(self, usual: int, judged: bool) -> tuple[str, str] | None:
        """What is full for a call of ``usual`` judgments (None: it fits)."""
        full = self._which_full(usual, judged)
        if full is not None and not (full[1] == "judgments" and self._not_the_limit(usual)):
            self._window.short[full[1]] += 1
        return full

    def _not_the_limit(self, usual: int) -> bool:
        """Whether a call of ``usual`` judgments kept out says nothing about the judgment limit,
        so that it must not count as demand the limit should grow for: one that would not fit
        even at the cap (beside a call larger than it, admitted alone), or one kept out only by
        large bodies' estimates (a body holds the room left whatever the limit)."""
        if self.cap_judgments is not None and self.judgments + usual > self.cap_judgments:
            return True
        return bool(self.estimated) and self._fits(self.judgments - self.estimated, usual)

    def _which_full(self, usual: int, judged: bool) -> tuple[str, str] | None:
        if self.max_calls is not None and self.calls and self.calls >= self.max_calls:
            return (f"{self.calls} calls in flight, limit {self.max_calls} "
                    f"({self._sizing('calls')})", "calls")
        if judged and not self._fits(self.judgments, usual):
            return (f"{self.judgments} judgments in flight, limit {self.max_judgments} "
                    f"({self._sizing('judgments')})", "judgments")
        return None

    def _room_error(self, usual: int, judged: bool, stage: str) -> Overloaded | None:
        full = self._full(usual, judged)
        return None if full is None else self._refuse(*full, stage)

    def _sizing(self, what: str) -> str:
        cap = self.cap_calls if what == "calls" else self.cap_judgments
        floor = self.min_calls if what == "calls" else self.floor
        cap_path, floor_path = (
            ("service.admission.max_calls_in_flight", "service.admission.min_calls_in_flight")
            if what == "calls" else
            ("service.admission.max_judgments_in_flight", "service.admission.min_judgments_in_flight"))
        name = f"{cap_path}={cap}"
        if not self.adaptive:
            return name
        target = self.target()
        sized = ("nothing measured yet" if target is None
                 else f"measured throughput x {target * 1000:.0f} ms latency target")
        if what == "judgments" and self._batches is not None:
            floor_path = "one full batch of every engine the calls use"
        return f"{sized}, between {floor_path}={floor} and {name}"

    def _usual(self) -> int:
        return round(min(self._call_judgments, self.max_judgments or 0))

    def _bytes_full(self) -> Overloaded | None:
        if self.max_bytes is None or self.bytes < self.max_bytes:
            return None
        return self._refuse(f"{self.bytes} request bytes in flight, limit "
                            f"service.admission.max_request_bytes_in_flight={self.max_bytes}",
                            "bytes", "before_read")

    def _wake(self) -> None:
        """Room was freed: let waiting calls in, in order, while they fit."""
        self._room.wake(self._let_in)

    def _let_in(self, judged: bool) -> Ticket | None:
        """A ticket for a waiting call, its room held from now on (None: it does not fit)."""
        if self._full(self._usual(), judged) is not None:
            return None
        ticket = Ticket(self, judged=judged)
        self._hold(ticket, self._usual() if judged else 0, 0, 1)
        return ticket

    def _hold(self, ticket: Ticket, judgments: int, nbytes: int, calls: int = 0) -> None:
        self.judgments += judgments
        self.bytes += nbytes
        self.calls += calls
        ticket.judgments += judgments
        ticket.nbytes += nbytes
        ticket.calls += calls
        self._window.held(self.judgments - self.estimated)  # the work held, not estimates
        if self.calls == calls > 0:
            self._window.busy_since = self._clock()
        elif not self.calls and calls < 0:
            self._window.idle(self._clock())

    def _add_bytes(self, ticket: Ticket, nbytes: int) -> None:
        """The request has arrived: hold the call, its bytes and, until its own judgments are
        known, one usual call's worth, so that calls parsing at the same time see each other."""
        if self.max_bytes is not None and self.bytes and self.bytes + nbytes > self.max_bytes:
            raise self._refuse(
                f"{self.bytes} request bytes in flight and this call has {nbytes}, limit "
                f"service.admission.max_request_bytes_in_flight={self.max_bytes}", "bytes",
                "after_read",
            )
        if ticket.calls:  # let in from the waiting room: its room is held already
            self._hold(ticket, 0, nbytes)
            return
        usual = self._usual() if ticket.judged else 0
        # with a line, a call found room when it arrived and is not refused for the calls that
        # found it too while their requests arrived (they overshoot the limits by that much)
        refused = None if self._room.open else self._room_error(usual, ticket.judged, "after_read")
        if refused is not None:
            raise refused
        hold = usual
        estimate = round(nbytes / self._bytes_per_judgment) if self._bytes_per_judgment else 0
        if ticket.judged and estimate >= LARGE_BODY * usual:  # a large body: its estimate
            # held up to the room left, not refused on it: bytes only estimate judgments (a
            # long id or history is not work), so one large body still enters beside small
            # calls, and the next large body finds the room taken and is refused unparsed
            room = estimate if self.max_judgments is None else self.max_judgments - self.judgments
            hold = max(usual, min(estimate, room))
            ticket.estimated = hold - usual
            self.estimated += ticket.estimated
        self._hold(ticket, hold, nbytes, 1)

    def _parsed(self, ticket: Ticket) -> None:
        """The call's estimate (if any) no longer stands: it was parsed or it ended."""
        self.estimated -= ticket.estimated
        ticket.estimated = 0

    def _admit(self, ticket: Ticket, judgments: int, nli: int) -> None:
        others = self.judgments - ticket.judgments  # without this call's provisional hold
        # with a line, only a call larger than it held (a usual call, or its body's estimate)
        # is refused when it does not fit: the room it held was counted when it arrived
        strict = not self._room.open or judgments > ticket.judgments
        if strict and not self._fits(others, judgments):
            raise self._refuse(
                f"{others} judgments in flight and this call needs {judgments}, limit "
                f"{self.max_judgments} ({self._sizing('judgments')})",
                "judgments", "after_parse",
            )
        if not ticket.calls:  # not through add_bytes (called from the service directly)
            self._hold(ticket, 0, 0, 1)
        self._parsed(ticket)
        self._hold(ticket, judgments - ticket.judgments, 0)
        ticket.admitted_at = self._clock()
        ticket.nli = nli
        self._admitted += 1
        ticket.alone = others == 0 and self.calls == 1
        ticket.seq = self._admitted
        if not ticket.judged:
            return
        if judgments and ticket.nbytes:
            per = ticket.nbytes / judgments
            self._bytes_per_judgment += (_EWMA * (per - self._bytes_per_judgment)
                                         if self._bytes_per_judgment else per)
        self._call_judgments = usual_size(self._call_judgments, judgments, _EWMA)
        self._wake()

    def _release(self, ticket: Ticket) -> None:
        judgments = ticket.judgments
        self._parsed(ticket)
        self._hold(ticket, -ticket.judgments, -ticket.nbytes, -ticket.calls)
        if ticket.admitted_at is not None and ticket.judged:
            now = self._clock()
            # from its arrival, not its admission: time spent waiting for the event loop (an
            # ingress-bound server) is latency too, and must shrink the limit
            took = now - ticket.arrived_at
            self._call_s += _EWMA * (took - self._call_s)
            self._served_s += _EWMA * (now - ticket.admitted_at - self._served_s)
            # alone from its admission to its end: nobody else admitted or still held
            if ticket.alone and ticket.seq == self._admitted and not self.calls:
                self._alone.observe(judgments, took)
            self._window.done(judgments, took, nli=ticket.nli)
            if now - self._window.start >= WINDOW_S:
                self._resize(now)
        self._wake()

    @property
    def judgments_per_s(self) -> float | None:
        """Judgments completed per busy second (EWMA; None: not measured yet)."""
        return self._rates.judgments_per_s

    @property
    def calls_per_s(self) -> float | None:
        """Calls completed per busy second (EWMA; None: not measured yet)."""
        return self._rates.calls_per_s

    def _resize(self, now: float) -> None:
        """End a throughput window: update the rates and, if adaptive, the limits
        (:func:`~reward_server.service._sizing.new_limits`)."""
        w = self._window
        busy = w.busy_s + (now - w.busy_since if self.calls else 0.0)
        measured = self._rates.update(w, busy_s=busy, span_s=now - w.start)
        if w.judgments:
            self._used = (w.judgments > w.nli, w.nli > 0)
        self._window = Window(now, busy_since=now)
        self._window.held(self.judgments)
        self.loop_busy = self._loop_load.sample(now)
        target = self.target()
        if not self.adaptive or target is None or not w.calls or self.judgments_per_s is None:
            return
        assert self.max_judgments is not None and self.max_calls is not None
        before = self.max_judgments, self.max_calls
        self.max_judgments, self.max_calls = new_limits(
            w, limits=(self.max_judgments, self.max_calls), rates=self._rates, target_s=target,
            loop_busy=self.loop_busy, alone_s=self.alone_s, usual=self._usual(),
            judgments=Range(self.floor, self.cap_judgments),
            calls=Range(self.min_calls, self.cap_calls), measured=measured)
        metrics.set_admission_limits(self.max_judgments, self.max_calls)
        log_window(w, now, rates=self._rates, loop_busy=self.loop_busy, target_s=target,
                   limits=(before, (self.max_judgments, self.max_calls)))
