"""The HTTP door's connections: uvicorn's httptools protocol (llhttp, in C) with the door's
bounds on what a connection may hold.

The parser is llhttp rather than uvicorn's default h11 (pure Python): 1,024 request heads
arriving at once (slow bodies) held the event loop, health checks included, 150-180 ms with h11.
A request's app (routing, auth, admission, the call) starts once its body is in, so a slow body
costs its connection's parser and nothing else until then: the 1,024 calls that slow bodies
started at once, each a task that woke again for every body byte, held the loop as long as the
parsing did.
"""

from __future__ import annotations

import asyncio
import collections
from typing import TYPE_CHECKING, ClassVar

from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

if TYPE_CHECKING:
    from uvicorn._types import ASGI3Application

HEALTH_RESERVE = 16  # connections past server.http.max_connections that may only ask health
HEAD_AT = "reward_server.head_at"  # in scope["state"]: loop.time() when the request's head was in
MAX_HEAD_BYTES = 16 * 1024  # a request's line and headers (h11's bound, which llhttp lacks)


class DoorProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol (httptools), plus:

    - a connection must send a request's headers within ``header_timeout_s`` of opening or of
      its last answer (uvicorn's keep-alive timer starts only after a first answer, so
      connections that never send anything stayed open and, past its concurrency limit, made
      every request 503);
    - a request's line and headers may take :data:`MAX_HEAD_BYTES` (400 and closed past it;
      llhttp has no bound of its own);
    - a request's app starts once its body is in, or 64 KiB of it (uvicorn's read buffer; the
      app reads the rest), or when it has been ``body_timeout_s`` coming (the app then answers
      504 at once: :data:`HEAD_AT` tells it when the head came), or when the client leaves
      (the call ends CANCELLED) or the server stops; at once for ``Expect: 100-continue``;
    - past ``max_connections`` + :data:`HEALTH_RESERVE`, or past its address's share
      (``per_peer`` open connections already, counted in ``peers``), a new connection is
      closed at once (1,100 connections from one address sending a body byte every 5 s took
      every slot, the health reserve included, for as long as they went on).

    The door subclasses it with its settings (see ``HttpDoor.start``)."""

    header_timeout_s = 10.0
    body_timeout_s = 30.0  # server.receive_timeout_s
    max_connections = 1024
    per_peer: int | None = None
    peers: ClassVar[collections.Counter[str]] = collections.Counter()  # each door: its own
    hold_bodies = True  # start a request's app once its body is in (False: at its head)
    _header_timer: asyncio.TimerHandle | None = None
    _host: str | None = None  # counted in peers
    # where llhttp is: requests begun on this connection, inside a request (its body's end
    # included), inside a request's head; bytes of the head being read
    _messages = 0
    _in_message = False
    _in_head = False
    _head_bytes = 0
    _heading = False  # in on_headers_complete
    _held: tuple[RequestResponseCycle, ASGI3Application] | None = None  # its body still coming
    _body_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        if len(self.connections) > self.max_connections + HEALTH_RESERVE or (
                self.per_peer is not None and self.peers[host] >= self.per_peer):
            transport.close()
            return
        self._host = host
        self.peers[host] += 1
        self._arm()

    def data_received(self, data: bytes) -> None:
        messages, in_message, in_head = self._messages, self._in_message, self._in_head
        super().data_received(data)
        if self.cycle is not None and not self.cycle.response_complete:
            self._disarm()  # a request's headers are in
        held = self._held
        if held is not None and (not held[0].more_body or len(held[0].body) >= HIGH_WATER_LIMIT):
            self._release()
        elif held is not None and self._body_timer is None:
            self._body_timer = self.loop.call_later(self.body_timeout_s, self._release)
        # a read is all head when it began inside a head, or between requests, and the same
        # head is still unfinished after it; a read that also held an earlier request's tail
        # (pipelined, or a body left unread behind an early answer) is not counted: at most
        # one read (256 KiB) past the bound
        if self._in_head and not self.transport.is_closing() and (
                (in_head and self._messages == messages)
                or (not in_message and self._messages == messages + 1)):
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._refuse_head()

    def _refuse_head(self) -> None:
        if self.cycle is not None and not self.cycle.response_complete:
            # pipelined behind a request not yet answered: a 400 now would read as its answer
            self.transport.close()
            return
        self.send_400_response(f"The request line and headers are longer than "
                               f"{MAX_HEAD_BYTES} bytes.")

    # llhttp's callbacks (uvicorn's, plus where the parser is)
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._messages += 1
        self._in_message = self._in_head = True
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._heading = True
        try:
            super().on_headers_complete()
        finally:
            self._heading = False

    def on_message_complete(self) -> None:
        self._in_message = False
        super().on_message_complete()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        cycle.scope["state"][HEAD_AT] = self.loop.time()
        if self._heading and self.hold_bodies and not cycle.waiting_for_100_continue:
            self._held = (cycle, app)  # data_received starts it once its body is in
            return
        super()._start_asgi_task(cycle, app)

    def _release(self) -> None:
        """Start the held request's app (see the class doc)."""
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        held, self._held = self._held, None
        if held is not None:
            super()._start_asgi_task(*held)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()

    def shutdown(self) -> None:
        self._release()  # its app refuses it (draining); the connection closes after
        super().shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._release()  # its app sees the client gone: CANCELLED, as a call begun
        if self._host is not None:
            self.peers[self._host] -= 1
            if self.peers[self._host] <= 0:
                del self.peers[self._host]
            self._host = None
        super().connection_lost(exc)

    # the header timer
    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timeout)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
            self.transport.close()
