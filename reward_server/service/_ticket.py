"""What one call holds (:class:`Ticket`), and its three steps through admission.

The transport asks in three steps, each before the heavier work that follows it:
:meth:`~reward_server.service.admission.Admission.arrive` (or
:meth:`~reward_server.service.admission.Admission.enter`, which does not wait) before reading
the request body (is there room for a call of the usual size?), :meth:`Ticket.add_bytes` with
the body's size before parsing it (holding the call, its bytes and, provisionally, a usual
call's judgments, or more when the body is large
(:data:`~reward_server.service._sizing.LARGE_BODY`): its size over the admitted calls' average
bytes per judgment, up to the room left, so one large body enters beside small calls and a flood
of large bodies is refused before it is parsed), :meth:`Ticket.admit` with its judgments before
fanning out. Under overload most refusals come from the first two steps and cost no parsing; a
call whose request never arrives holds nothing. It is applied after authentication, so
unauthenticated calls never hold any of it.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Protocol


class _Admission(Protocol):
    """What a ticket asks of :class:`~reward_server.service.admission.Admission` (a protocol,
    so that this module does not import the one that imports it)."""

    _clock: Callable[[], float]

    def _add_bytes(self, ticket: Ticket, nbytes: int) -> None: ...

    def _admit(self, ticket: Ticket, judgments: int, nli: int) -> None: ...

    def _release(self, ticket: Ticket) -> None: ...


class Ticket:
    """What one call holds; release it (or leave the ``with`` block) when the call ends."""

    def __init__(self, admission: _Admission, *, judged: bool = True) -> None:
        self._admission = admission
        self.judged = judged
        self.arrived_at = admission._clock()
        self.nbytes = 0
        self.judgments = 0
        self.nli = 0  # of its judgments once admitted, NLI pairs
        self.estimated = 0  # of its judgments: its body's estimate past a usual call
        self.calls = 0
        self.admitted_at: float | None = None
        self.alone = False
        self.seq = 0
        self._released = False

    def add_bytes(self, nbytes: int) -> None:
        """Hold the call and the request's ``nbytes`` (refused with Overloaded if they do not
        fit)."""
        self._admission._add_bytes(self, nbytes)

    def admit(self, judgments: int, *, nli: int = 0) -> None:
        """Hold exactly ``judgments`` (in place of the provisional hold), refused with
        Overloaded if they do not fit beside the others'; ``nli``: how many of them are NLI
        pairs (the rest judge prompts)."""
        self._admission._admit(self, judgments, nli)

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
