"""A budget for response bytes buffered for peers that do not read them.

gRPC holds a call's serialized response until the peer's HTTP/2 flow-control window lets it
out; a peer that never reads (a zero receive window, a stalled socket) keeps every response it
asked for in the server's memory, one per stream, on as many connections as it opens. So every
response counts here from the moment the handler returns it until its call ends (gRPC's done
callback, which fires once the response and status were written or the call was cancelled):

- one connection (``context.peer()``, the peer's address and port) may hold at most
  ``per_connection`` such bytes, all connections together at most ``total``; a response that
  does not fit is dropped, its call answered RESOURCE_EXHAUSTED, and the connection's other calls
  in flight are cancelled (they would only add to what it does not read);
- a call arriving on a connection already over its budget is refused before its request is
  read.

A response larger than a budget still goes out when nothing else is held (as admission lets a
call larger than its limit run alone). The connection itself is closed by gRPC's keepalive
(``server.keepalive_time_s`` + ``keepalive_timeout_s``) when the peer does not answer its ping.
"""

from __future__ import annotations

import asyncio
import logging

from reward_server import metrics
from reward_server.errors import Overloaded

logger = logging.getLogger(__name__)


class UnsentResponses:
    """Response bytes per connection that gRPC has not yet written (see the module doc)."""

    def __init__(self, *, per_connection: int, total: int) -> None:
        self.per_connection = per_connection
        self.total_limit = total
        self.total = 0
        self.by_peer: dict[str, int] = {}
        self._calls: dict[str, set[asyncio.Task[object]]] = {}
        self.refused = 0

    def _refuse(self, peer: str, why: str) -> Overloaded:
        self.refused += 1
        metrics.observe_refusal("unsent_responses", "response")
        return Overloaded(
            f"{why}; read the responses of this connection (its HTTP/2 window is not being "
            "opened) or open fewer calls at once"
        )

    def enter(self, peer: str) -> None:
        """A call starts on ``peer``'s connection: refused if it already holds its budget."""
        held = self.by_peer.get(peer, 0)
        if held >= self.per_connection:
            raise self._refuse(peer, f"this connection has {held} response bytes unread, limit "
                                     f"server.max_unsent_response_bytes_per_connection="
                                     f"{self.per_connection}")
        task = asyncio.current_task()
        if task is not None:
            self._calls.setdefault(peer, set()).add(task)

    def leave(self, peer: str) -> None:
        """The call's handler ends (its response, if any, is held by :meth:`hold`)."""
        calls = self._calls.get(peer)
        if calls is not None:
            calls.discard(asyncio.current_task())
            if not calls:
                del self._calls[peer]

    def hold(self, peer: str, nbytes: int) -> None:
        """Hold ``nbytes`` of response for ``peer`` until :meth:`release`; Overloaded (and the
        connection's other calls cancelled) when they do not fit."""
        held = self.by_peer.get(peer, 0)
        why = None
        if held and held + nbytes > self.per_connection:
            why = (f"this connection has {held} response bytes unread and this response has "
                   f"{nbytes}, limit server.max_unsent_response_bytes_per_connection="
                   f"{self.per_connection}")
        elif self.total and self.total + nbytes > self.total_limit:
            why = (f"{self.total} response bytes are unread by their peers and this response "
                   f"has {nbytes}, limit server.max_unsent_response_bytes={self.total_limit}")
        if why is not None:
            self._cancel_others(peer)
            raise self._refuse(peer, why)
        self.by_peer[peer] = held + nbytes
        self.total += nbytes

    def release(self, peer: str, nbytes: int) -> None:
        left = self.by_peer.get(peer, 0) - nbytes
        if left > 0:
            self.by_peer[peer] = left
        else:
            self.by_peer.pop(peer, None)
        self.total -= nbytes

    def _cancel_others(self, peer: str) -> None:
        me = asyncio.current_task()
        others = [t for t in self._calls.get(peer, ()) if t is not me and not t.done()]
        if others:
            logger.warning("cancelling %d calls of %s: it does not read its responses",
                           len(others), peer)
        for t in others:
            t.cancel()
