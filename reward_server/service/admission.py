"""Admission control: bounded work in flight, and a bounded line for the rest, within its deadline.

Work is counted in judgments (judge prompts plus NLI pairs, see :mod:`reward_server.service.validation`),
in calls and in request bytes: one call of 1,024 items costs what 1,024 calls of one item cost in
judgments, and every call (Info too) holds one call slot. A call is admitted when it fits beside
what is already in flight, or when nothing is in flight (so a request larger than the limit still
runs, alone).

**A call that does not fit waits in line** (:meth:`Admission.arrive`; the default, ``max_waiting``
calls at most, before its request is read, so a waiting call holds no admitted work), most
previous attempts first, then the earliest, for as long as its deadline allows less the time a
call takes once admitted. It is refused at once when the line's predicted wait (the work held and
the usual calls ahead of it past the limit, over the measured throughput) would pass its
deadline, or when the line is full; a call that waited until its deadline no longer allows it is
refused then. The engines are kept busy with the limits' worth of work (by default 64 full
batches of every engine), and a trainer's closed loop of calls that the engines keep up with
never waits: the limits are far from full. A refusal is :class:`~reward_server.errors.Overloaded`
(RESOURCE_EXHAUSTED), carrying a retry hint: about one admitted call's duration (a moving
average), jittered, between 50 ms and 5 s, and later when many were refused before it: a virtual
line paced by the calls completing (:class:`~reward_server.service._limiter.RetryLine`). With
``max_waiting`` 0 there is no line: a call that does not fit is refused at once.

**The limits can follow the engines** (``adaptive``, off by default): by Little's law, the
measured throughput times a latency target, between a floor and the caps, resized every
:data:`~reward_server.service._sizing.WINDOW_S` (:mod:`reward_server.service._sizing`).

The transport asks in three steps, each before the heavier work that follows it (see
:mod:`reward_server.service._ticket`).
"""

from __future__ import annotations

import asyncio

from reward_server import metrics
from reward_server.errors import Overloaded
from reward_server.service._limits import RETRIES_PER_COMPLETED, Limits
from reward_server.service._ticket import Ticket
from reward_server.service._waiting import predicted_wait
from reward_server.service.settings import AdmissionSettings

__all__ = ["RETRIES_PER_COMPLETED", "Admission", "Ticket"]


class Admission(Limits):
    """The limits of one server (:class:`~reward_server.service._limits.Limits`), the work
    admitted now, and how a call arrives: admitted at once, waiting in line, or refused."""

    @property
    def waiting(self) -> int:
        """Retried calls waiting for room now."""
        return len(self._room)

    @classmethod
    def off(cls) -> Admission:
        return cls(max_judgments=None, max_bytes=None)

    @classmethod
    def from_settings(
        cls, s: AdmissionSettings, *, engine_batch_items: int, nli_batch_items: int = 0
    ) -> Admission:
        """``engine_batch_items``: the items one full batch of every engine replica holds;
        ``nli_batch_items``: of those, a separate NLI engine's (0: none, or judge-as-NLI). With
        both engines and no configured floor, the floor follows the calls' mix."""
        if not s.enabled:
            return cls.off()
        split = None
        if s.min_judgments_in_flight is None and 0 < nli_batch_items < engine_batch_items:
            split = (engine_batch_items - nli_batch_items, nli_batch_items)
        cap = s.max_judgments_in_flight or s.batches_in_flight * engine_batch_items
        admission = cls(
            max_judgments=cap, max_bytes=s.max_request_bytes_in_flight,
            max_calls=s.max_calls_in_flight, adaptive=s.adaptive,
            min_judgments=s.min_judgments_in_flight or engine_batch_items,
            min_calls=s.min_calls_in_flight, target_s=s.target_p99_s, max_wait_s=s.max_wait_s,
            max_waiting=s.max_waiting, batches=split,
        )
        # the process's admission (the one a server serves with): its gauges read when scraped
        metrics.watch_admitted(lambda: admission.judgments, lambda: admission.bytes)
        return admission

    def enter(self, *, judged: bool = True) -> Ticket:
        """A call arrives, before its request is read: refused at once if the calls are full or
        one usual call's judgments (:func:`~reward_server.service._sizing.usual_size`) would not fit; Info is
        not ``judged`` (it holds a call, no judgments). It holds nothing yet, so a call whose
        request never arrives holds no capacity."""
        refused = self._room_error(self._usual(), judged, "before_read") or self._bytes_full()
        if refused is not None:
            raise refused
        return Ticket(self, judged=judged)

    def refusal(self, *, judged: bool = True, attempts: int = 0,
                deadline: float | None = None) -> Overloaded | None:
        """The refusal :meth:`arrive` would answer at once for a call arriving now (counted as
        one), or None when that call would be admitted or wait in line. It holds nothing: a
        transport asks it first, so that a refused call costs as little as can be."""
        if not self._room and self._which_full(self._usual(), judged) is None and (
                self.max_bytes is None or self.bytes < self.max_bytes):
            return None
        if not self._room.open:
            return self._room_error(self._usual(), judged, "before_read") or self._bytes_full()
        return self._line_check(judged, attempts, deadline)[0]

    async def arrive(self, *, judged: bool = True, attempts: int = 0,
                     deadline: float | None = None) -> Ticket:
        """:meth:`enter`, waiting in line when there is no room (see the module doc).
        ``attempts``: gRPC's previous attempts of this call (more go first); ``deadline``: the
        event loop's time when the call's deadline passes (None: none)."""
        if not self._room and self._full(self._usual(), judged) is None:
            return self.enter(judged=judged)
        if not self._room.open:
            return self.enter(judged=judged)  # no line: refused at once (or room came free)
        refused, timeout = self._line_check(judged, attempts, deadline)
        if refused is not None:
            raise refused
        ticket = await self._room.wait(attempts, judged=judged, full=self._waiting_full,
                                       timeout_s=timeout)
        if ticket is not None:
            return ticket
        refused = self._room_error(self._usual(), judged, "waited")
        if refused is not None:
            raise refused
        return Ticket(self, judged=judged)

    def _line_check(self, judged: bool, attempts: int,
                    deadline: float | None) -> tuple[Overloaded | None, float | None]:
        """For a call that would join the line now: (its refusal, None) when the line has no
        place for it or cannot serve it within its deadline, else (None, how long it may wait,
        None: as long as the line allows)."""
        if self._room.turns_away(attempts):
            return self._waiting_full(), None
        if deadline is None:
            return None, None
        left = deadline - asyncio.get_running_loop().time()
        timeout = left - self._served_s  # it must still be served once let in
        wait = self._predicted_wait(attempts, judged)
        if timeout > 0 and (wait is None or wait <= timeout):
            return None, timeout
        return self._refuse(
            f"{len(self._room)} calls wait for room already and the line's predicted "
            f"wait{'' if wait is None else f' of {wait:.1f} s'} plus a call's "
            f"{self._served_s:.1f} s once admitted would pass this call's deadline "
            f"({left:.1f} s left; limits: {self.calls} of {self.max_calls} calls, "
            f"{self.judgments} of {self.max_judgments} judgments in flight)",
            "deadline", "before_read"), None

    def _predicted_wait(self, attempts: int, judged: bool) -> float | None:
        """Seconds until a call that joins the line now would be let in (None: not measured)."""
        return predicted_wait(
            ahead=self._room.ahead(attempts) + 1, calls=(self.calls, self.max_calls, self.calls_per_s),
            judgments=(self.judgments, self.max_judgments, self.judgments_per_s) if judged else None,
            usual=max(1, self._usual()))

    def _waiting_full(self) -> Overloaded:
        return self._refuse(f"{len(self._room)} calls wait for room already (limits: "
                            f"{self.calls} of {self.max_calls} calls, {self.judgments} of "
                            f"{self.max_judgments} judgments in flight)", "waiting", "before_read")
