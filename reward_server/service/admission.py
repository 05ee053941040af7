"""Admission control: bounded work in flight, refused cheaply when full.

Work is counted in judgments (judge prompts plus NLI pairs, see :mod:`reward_server.service.validation`)
and in request bytes, not in calls: one call of 1,024 items costs what 1,024 calls of one item
cost. A call is admitted when its work fits beside what is already in flight, or when nothing is
in flight (so a request larger than the limit still runs, alone). Otherwise it is refused at
once with :class:`~reward_server.errors.Overloaded` (RESOURCE_EXHAUSTED), carrying a retry hint:
about one admitted call's duration (a moving average), jittered, between 50 ms and 5 s.

The transport asks in three steps, each before the heavier work that follows it:
:meth:`Admission.enter` before reading the request body (is there room for a call of the usual
size?), :meth:`Ticket.add_bytes` with the body's size before parsing it (holding the bytes and,
provisionally, a usual call's judgments, or more when the body is large: its size over the
admitted calls' average bytes per judgment, so a flood of large bodies is refused before it is
parsed), :meth:`Ticket.admit` with its judgments before
fanning out. Under overload most refusals come from the first two steps and cost no parsing; a
call whose request never arrives holds nothing. It is applied after authentication, so
unauthenticated calls never hold any of it.
"""

from __future__ import annotations

import random
import time
from types import TracebackType

from pydantic import BaseModel, ConfigDict, Field

from reward_server import metrics
from reward_server.errors import Overloaded

_RETRY_MIN_S = 0.05
_RETRY_MAX_S = 5.0
_EWMA = 0.2


class AdmissionSettings(BaseModel):
    """How much work the server accepts at once (more is RESOURCE_EXHAUSTED with a retry hint)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(True, description="Refuse work beyond the limits below.")
    max_judgments_in_flight: int | None = Field(
        None, ge=1, description="Judgments (judge prompts plus NLI pairs) admitted at once. "
        "None: batches_in_flight times the engines' batching.max_items (summed over the judge "
        "and a separate NLI engine, times their replicas on Ray)."
    )
    batches_in_flight: int = Field(
        64, ge=1, description="With max_judgments_in_flight None: how many full engine batches "
        "of work may be admitted per engine replica."
    )
    max_request_bytes_in_flight: int = Field(
        512 * 1024 * 1024, ge=1024, description="Request bytes (encoded) held by admitted and "
        "parsing calls at once."
    )


class Admission:
    """The limits of one server and the work admitted now."""

    def __init__(
        self, *, max_judgments: int | None, max_bytes: int | None, seed: int | None = None
    ) -> None:
        self.max_judgments = max_judgments
        self.max_bytes = max_bytes
        self.judgments = 0  # held: admitted calls' judgments, and entering calls' provisional
        self.bytes = 0
        self.refused = 0
        self._call_s = 0.2  # moving average of admitted calls' duration
        self._call_judgments = 0.0  # moving average of admitted calls' judgments
        self._bytes_per_judgment = 0.0  # moving average over admitted calls (0: none yet)
        self._rng = random.Random(seed)

    @classmethod
    def off(cls) -> Admission:
        return cls(max_judgments=None, max_bytes=None)

    def retry_after_s(self) -> float:
        base = min(_RETRY_MAX_S, max(_RETRY_MIN_S, self._call_s))
        return base * self._rng.uniform(0.5, 1.5)

    def _refuse(self, what: str, limit: str, stage: str) -> Overloaded:
        self.refused += 1
        metrics.observe_refusal(limit, stage)
        wait = self.retry_after_s()
        return Overloaded(
            f"the server is at its admission limit: {what}; retry in about {wait * 1000:.0f} ms "
            "(grpc-retry-pushback-ms) or send smaller calls", retry_after_s=wait
        )

    def _fits(self, held: int, more: int) -> bool:
        return self.max_judgments is None or not held or held + more <= self.max_judgments

    def _room(self, usual: int, stage: str) -> None:
        if not self._fits(self.judgments, usual):
            raise self._refuse(
                f"{self.judgments} judgments in flight, limit "
                f"service.admission.max_judgments_in_flight={self.max_judgments}", "judgments",
                stage,
            )

    def _usual(self) -> int:
        return round(min(self._call_judgments, self.max_judgments or 0))

    def enter(self) -> Ticket:
        """A call arrives, before its request is read: refused at once if one usual call's
        judgments (a moving average of admitted calls) would not fit. It holds nothing yet,
        so a call whose request never arrives holds no capacity."""
        self._room(self._usual(), "before_read")
        if self.max_bytes is not None and self.bytes >= self.max_bytes:
            raise self._refuse(
                f"{self.bytes} request bytes in flight, limit "
                f"service.admission.max_request_bytes_in_flight={self.max_bytes}", "bytes",
                "before_read",
            )
        return Ticket(self)

    def _hold(self, ticket: Ticket, judgments: int, nbytes: int) -> None:
        self.judgments += judgments
        self.bytes += nbytes
        ticket.judgments += judgments
        ticket.nbytes += nbytes
        metrics.set_admitted(self.judgments, self.bytes)

    def _add_bytes(self, ticket: Ticket, nbytes: int) -> None:
        """The request has arrived: hold its bytes and, until its own judgments are known, one
        usual call's worth, so that calls parsing at the same time see each other."""
        if self.max_bytes is not None and self.bytes and self.bytes + nbytes > self.max_bytes:
            raise self._refuse(
                f"{self.bytes} request bytes in flight and this call has {nbytes}, limit "
                f"service.admission.max_request_bytes_in_flight={self.max_bytes}", "bytes",
                "after_read",
            )
        usual = self._usual()
        if self._bytes_per_judgment:  # a large body likely carries many judgments: estimate
            estimate = round(nbytes / self._bytes_per_judgment)
            usual = max(usual, min(estimate, self.max_judgments or estimate))
        self._room(usual, "after_read")
        self._hold(ticket, usual, nbytes)

    def _admit(self, ticket: Ticket, judgments: int) -> None:
        others = self.judgments - ticket.judgments  # without this call's provisional hold
        if not self._fits(others, judgments):
            raise self._refuse(
                f"{others} judgments in flight and this call needs {judgments}, limit "
                f"service.admission.max_judgments_in_flight={self.max_judgments}", "judgments",
                "after_parse",
            )
        self._hold(ticket, judgments - ticket.judgments, 0)
        ticket.admitted_at = time.perf_counter()
        if judgments and ticket.nbytes:
            per = ticket.nbytes / judgments
            self._bytes_per_judgment += (_EWMA * (per - self._bytes_per_judgment)
                                         if self._bytes_per_judgment else per)
        if self._call_judgments:
            self._call_judgments += _EWMA * (judgments - self._call_judgments)
        else:
            self._call_judgments = float(judgments)

    def _release(self, ticket: Ticket) -> None:
        self._hold(ticket, -ticket.judgments, -ticket.nbytes)
        if ticket.admitted_at is not None:
            took = time.perf_counter() - ticket.admitted_at
            self._call_s += _EWMA * (took - self._call_s)


class Ticket:
    """What one call holds; release it (or leave the ``with`` block) when the call ends."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self.nbytes = 0
        self.judgments = 0
        self.admitted_at: float | None = None
        self._released = False

    def add_bytes(self, nbytes: int) -> None:
        """Hold the request's ``nbytes`` too (refused with Overloaded if they do not fit)."""
        self._admission._add_bytes(self, nbytes)

    def admit(self, judgments: int) -> None:
        """Hold exactly ``judgments`` (in place of the provisional hold), refused with
        Overloaded if they do not fit beside the others'."""
        self._admission._admit(self, judgments)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._admission._release(self)

    def __enter__(self) -> Ticket:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
