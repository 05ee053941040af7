"""The line of admission control: calls that wait for room, in fair order.

A call that does not fit waits here, as long as its own timeout (its deadline, at most
``max_wait_s``) allows and with at most ``max_waiting`` others. Room freed goes first to the call
with the most previous attempts (gRPC's ``grpc-previous-rpc-attempts``, or our client's
``reward-previous-attempts``), then to the earliest. When the line is full, a call with more
attempts takes the place of the newest with fewer, which is refused at once.
:class:`~reward_server.service.admission.Admission` decides what fits and holds the room; this
module only keeps the order.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING

from reward_server.errors import Overloaded

if TYPE_CHECKING:
    from reward_server.service._ticket import Ticket

_Entry = tuple[int, int, "asyncio.Future[Ticket]", bool]  # -attempts, arrival, answer, judged


class WaitingRoom:
    """Calls waiting for room: most previous attempts first, then the earliest."""

    def __init__(self, *, max_wait_s: float | None, max_waiting: int) -> None:
        self.max_wait_s, self.max_waiting = max_wait_s, max_waiting
        self._heap: list[_Entry] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    @property
    def open(self) -> bool:
        """Whether calls may wait at all (``max_waiting`` and ``max_wait_s`` above 0)."""
        return self.max_waiting > 0 and (self.max_wait_s is None or self.max_wait_s > 0)

    def turns_away(self, attempts: int) -> bool:
        """Whether a call with ``attempts`` would find the line full of calls with at least
        as many."""
        return len(self._heap) >= self.max_waiting and max(self._heap)[0] <= -attempts

    def ahead(self, attempts: int) -> int:
        """How many waiting calls a call with ``attempts`` would wait behind."""
        return sum(1 for entry in self._heap if -entry[0] >= attempts)

    async def wait(self, attempts: int, *, judged: bool, full: Callable[[], Overloaded],
                   timeout_s: float | None = None) -> Ticket | None:
        """Wait for the ticket :meth:`wake` hands over (None: ``timeout_s``, at most
        ``max_wait_s``, passed first). Raises ``full()`` when the line is full of calls with at
        least as many attempts, and refuses the newest with fewer in this call's place."""
        limits = [t for t in (timeout_s, self.max_wait_s) if t is not None]
        fut: asyncio.Future[Ticket] = asyncio.get_running_loop().create_future()
        entry = (-attempts, next(self._seq), fut, judged)
        if len(self._heap) >= self.max_waiting:
            newest = max(self._heap)  # fewest attempts, latest arrival
            if newest[:2] < entry[:2]:
                raise full()
            self._remove(newest)
            newest[2].set_exception(full())
        heapq.heappush(self._heap, entry)
        try:
            return await asyncio.wait_for(fut, min(limits) if limits else None)
        except TimeoutError:
            return None
        except asyncio.CancelledError:  # the call went away: give back the room it was given
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                fut.result().release()
            raise
        finally:
            if entry in self._heap:
                self._remove(entry)

    def wake(self, let_in: Callable[[bool], Ticket | None]) -> None:
        """Room was freed: hand waiting calls, in order, the tickets ``let_in(judged)`` gives
        (None: the next does not fit; it and those behind it wait on)."""
        while self._heap:
            _, _, fut, judged = self._heap[0]
            if not fut.done():
                ticket = let_in(judged)
                if ticket is None:
                    return
                fut.set_result(ticket)
            heapq.heappop(self._heap)

    def _remove(self, entry: _Entry) -> None:
        self._heap.remove(entry)
        heapq.heapify(self._heap)


Limit = tuple[int, int | None, float | None]  # held now, the limit (None: none), completed per s


def predicted_wait(*, ahead: int, calls: Limit, judgments: Limit | None,
                   usual: int) -> float | None:
    """Seconds until a call with ``ahead`` calls before it in line (itself included) would be
    let in: the calls and (for a call with judgments) the usual calls' judgments held and
    waiting past each limit, over the rate at which they complete. None: a rate is not
    measured yet."""
    waits = [0.0]
    held, limit, rate = calls
    if limit is not None and rate:
        waits.append((held + ahead - limit) / rate)
    if judgments is not None:
        held, limit, rate = judgments
        if limit is not None:
            if not rate:
                return None
            waits.append((held + ahead * usual - limit) / rate)
    return max(waits)
