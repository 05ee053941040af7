"""Per-connection limits of the gRPC port that gRPC core has no setting for (Linux).

gRPC core bounds connections as a whole (``grpc.max_allowed_incoming_connections``), streams
per connection and calls waiting to be taken, but nothing per peer, and a grpc.aio application
cannot close one connection. :class:`ConnectionGuard` can: it finds the connection's socket
among the process's descriptors (``/proc/self/fd``) and shuts it down (``shutdown(2)`` on a
duplicate, after checking the duplicate's addresses), so gRPC core sees the connection end,
cancels its calls and frees it, as if the peer had gone. It closes:

* a peer's connections past its share (``server.max_connections_per_peer``), the most idle
  first: one address cannot take the whole connection cap and lock everyone else out. While a
  peer holds its share, its new connections are dropped by the kernel before gRPC accepts them
  (:mod:`reward_server.rpc.synfilter`): gRPC keeps a handle for every connection it ever had
  open at once, so closing them afterwards would leave their memory behind;
* a connection whose client resets calls before their request arrives (rapid reset,
  CVE-2023-44487): gRPC core hands each such call to the server, which takes them one at a time,
  so past :data:`MAX_EARLY_RESETS` of them the connection is closed, and its address gets no new
  connection for :data:`RESET_WINDOW_S` (the same kernel filter);
* a connection that keeps more than half of ``server.max_concurrent_streams`` calls waiting for
  their request for two looks in a row (parked half-open calls); and calls of a peer that has
  :data:`MAX_WAITING_PER_PEER` calls waiting already are refused at once, so that memory stays
  bounded, and the connection of such a call closed at once if it keeps
  :data:`WAITING_TO_CLOSE` of them;
* a connection that sent more bytes that did not become request messages than one request may
  have (``server.max_message_bytes``) plus :data:`UNREAD_SLACK_BYTES` (a CONTINUATION flood: a
  header block that never ends, which gRPC core reads and drops without end), from the kernel's
  count of the bytes it received (``TCP_INFO``) against the requests' bytes, counted from when
  the connection was first seen (never below zero: a request's message counts when it is
  complete, its bytes before).

It looks every ``server.connection_check_s`` (in a worker thread; about 20 us per descriptor
on a 2-core machine, so tens of milliseconds with thousands of connections, not on the event
loop), and sooner when the process's open descriptors have grown by a peer share's eighth since
the last look (a flood of new connections: the count is ``/proc/self/fd``'s size, read every
:data:`TRIGGER_CHECK_S` on the event loop, a few microseconds; Linux 6.2 and later, before it
only the regular looks run), at most half of the time; such a look first counts each peer's
connections from the kernel (:mod:`~reward_server.rpc.sockdiag`, several times faster) and
looks at every descriptor only once a peer is at its share. It reports the main port full while
its connections reach ``server.max_connections``, for health. Elsewhere than on Linux it does
nothing (logged once).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import sys
import time
from collections.abc import Callable

from reward_server.rpc import sockdiag, synfilter
from reward_server.rpc.sockscan import Conn, Socket, scan, shut

logger = logging.getLogger(__name__)

MAX_EARLY_RESETS = 256  # calls reset before their request, per connection and RESET_WINDOW_S
RESET_WINDOW_S = 10.0  # and, once its connection is closed for it, how long an address that
# reset them gets no new connection (the kernel filter below; it would reconnect at once)
MAX_WAITING_PER_PEER = 1024  # calls of one address waiting for their request at once; past
WAITING_TO_CLOSE = 8  # it, a connection of that address with this many waiting is closed at once
UNREAD_SLACK_BYTES = 16 * 1024 * 1024  # past one request, before a connection counts as flooding
CALL_OVERHEAD_BYTES = 16 * 1024  # a call's headers, framing and window updates, generously
TRIGGER_CHECK_S = 0.02  # how often the open descriptors are counted between looks


class ConnectionGuard:
    """The limits above for the connections of one gRPC port (call its methods from the
    event loop; :meth:`watch` runs as a task)."""

    def __init__(self, port: int, *, max_connections: int | None, per_peer: int | None,
                 max_streams: int, max_message: int, every_s: float,
                 shared_port: bool = False) -> None:
        self.port = port
        self.max_connections, self.per_peer = max_connections, per_peer
        self.every_s = every_s
        self.enabled = sys.platform.startswith("linux") and os.path.isdir("/proc/self/fd")
        self.max_parked = max(1, max_streams // 2)
        self.max_unread = max_message + UNREAD_SLACK_BYTES
        self.full: str | None = None  # why new connections may be refused now (health)
        self.closed: collections.Counter[str] = collections.Counter()  # by reason
        self._waiting: collections.Counter[Conn] = collections.Counter()  # calls, per connection
        self._waiting_by_host: collections.Counter[str] = collections.Counter()
        self._resets: dict[Conn, collections.deque[float]] = {}
        self._seen: collections.Counter[Conn] = collections.Counter()  # request bytes, calls
        self._received: dict[Conn, int] = {}  # the kernel's count at the last look
        self._unread: dict[Conn, int] = {}  # received but no request, since first seen
        self._parked_before: set[Conn] = set()
        self._closing: set[Conn] = set()
        self.blocked: frozenset[str] = frozenset()  # peers at their share: new ones dropped
        self._block: frozenset[str] = frozenset()  # what the last look asked for
        self._filter = self.enabled and per_peer is not None
        self._quick = self._filter  # a flood's first look from the kernel's socket lists
        self._shared_port = shared_port  # other processes listen on it too (reuse_port)
        self._listeners: list[int] = []  # the port's listening sockets, from the last look
        self._files_at_look = 0
        self._barred: dict[str, float] = {}  # rapid resetters: no new connection until then
        self._trigger = max(16, (per_peer or 0) // 8)
        self.on_full_change: Callable[[], None] | None = None  # health looks again
        if not self.enabled:
            logger.info("connection limits per peer are not enforced here (no /proc/self/fd)")

    # ------------------------------------------------------------ from calls
    def started(self, conn: Conn | None) -> str | None:
        """A call arrives on ``conn``: None, or why it is refused (its peer has
        :data:`MAX_WAITING_PER_PEER` calls waiting for their request already)."""
        if conn is None:
            return None
        self._seen[conn] += CALL_OVERHEAD_BYTES
        if self._waiting_by_host[conn[0]] < MAX_WAITING_PER_PEER:
            return None
        if self._waiting[conn] >= WAITING_TO_CLOSE:  # one of the connections keeping them
            self._close_now(conn, f"{self._waiting[conn]} calls wait for their request "
                                  f"message, and {MAX_WAITING_PER_PEER} from {conn[0]}", "waiting")
        return (f"{MAX_WAITING_PER_PEER} calls from {conn[0]} wait for their request message "
                "already; send each call's request with its headers")

    def reading(self, conn: Conn | None) -> None:
        """A call on ``conn`` reads its request, which has not arrived (admitted calls only:
        one waiting in admission's line has not asked for it yet)."""
        if conn is not None:
            self._waiting[conn] += 1
            self._waiting_by_host[conn[0]] += 1

    def received(self, conn: Conn | None, nbytes: int, *, first: bool) -> None:
        """A request message of ``nbytes`` arrived on ``conn`` (``first``: the call's first)."""
        if conn is None:
            return
        self._seen[conn] += nbytes
        if first:
            self._unwait(conn)

    def ended(self, conn: Conn | None, *, waiting: bool, reset_early: bool) -> None:
        """A call on ``conn`` ended (``waiting``: with no request yet; ``reset_early``: the
        client cancelled it before sending its request)."""
        if conn is None:
            return
        if waiting:
            self._unwait(conn)
        if reset_early:
            now = time.monotonic()
            times = self._resets.setdefault(conn, collections.deque())
            times.append(now)
            while times and times[0] < now - RESET_WINDOW_S:
                times.popleft()
            if len(times) >= MAX_EARLY_RESETS:
                self._resets.pop(conn, None)
                self._close_now(conn, f"{MAX_EARLY_RESETS} calls reset before their request "
                                      f"within {RESET_WINDOW_S:.0f} s (rapid reset)", "rapid_reset")
                if self._filter:  # and keep it out a while (a look soon sets the filter)
                    self._barred[conn[0]] = now + RESET_WINDOW_S

    def _unwait(self, conn: Conn) -> None:
        self._waiting[conn] -= 1
        if self._waiting[conn] <= 0:
            del self._waiting[conn]
        self._waiting_by_host[conn[0]] -= 1
        if self._waiting_by_host[conn[0]] <= 0:
            del self._waiting_by_host[conn[0]]

    # ------------------------------------------------------------ closing
    def _close_now(self, conn: Conn, why: str, reason: str) -> None:
        """Close ``conn`` (in a worker thread: it looks through the descriptors)."""
        if not self.enabled or conn in self._closing:
            return
        self._closing.add(conn)

        def close() -> None:
            for s in scan(self.port):
                if s.conn == conn and shut(s.fd, self.port, conn):
                    self._log_close(conn, why, reason)

        future = asyncio.get_running_loop().run_in_executor(None, close)
        future.add_done_callback(lambda _f: self._closing.discard(conn))

    def _log_close(self, conn: Conn, why: str, reason: str) -> None:
        self.closed[reason] += 1
        logger.warning("closed the connection from %s:%d: %s", conn[0], conn[1], why)

    # ------------------------------------------------------------ looking
    async def watch(self) -> None:
        """Look at the connections every ``every_s`` (until cancelled)."""
        if not self.enabled:
            return
        took = 0.0
        while True:
            flood = await self._until_next_look(rest_s=took)
            t0 = time.perf_counter()
            try:
                self._files_at_look = sockdiag.open_files()
                if flood and self._quick and self._listeners and not await asyncio.to_thread(
                        self._quick_look, self._kept_out(set())):
                    took = time.perf_counter() - t0
                    continue  # no peer at its share yet: the next look when it grows again
                self._listeners = []
                sockets = await asyncio.to_thread(scan, self.port, self._listeners)
                closing = self._judge(sockets)
                if self._block != self.blocked:
                    await asyncio.to_thread(self._set_filter, self._block, self._listeners)
                if closing:
                    await asyncio.to_thread(self._shut_all, closing)
            except Exception:  # never let the watch die; the next look tries again
                logger.exception("looking at the connections failed")
            took = time.perf_counter() - t0

    def _quick_look(self, barred: frozenset[str]) -> bool:
        """Count each peer's connections from the kernel (:mod:`~reward_server.rpc.sockdiag`,
        several times faster than :func:`scan`) and stop new ones of those at their share and
        of ``barred`` (in the worker thread; ``barred`` is read on the event loop, which
        changes it); whether the full look should follow (a peer is past its share now, or
        the count failed)."""
        try:
            counts = sockdiag.peers(self.port, shared=self._shared_port)
        except OSError as e:
            self._quick = False
            logger.info("the kernel's socket diagnostics are not available (%s): a flood of "
                        "connections is looked at descriptor by descriptor", e)
            return True
        assert self.per_peer is not None
        want = self.blocked | barred | {h for h, n in counts.items() if n >= self.per_peer}
        if want == self.blocked:
            return False
        self._set_filter(want, self._listeners)
        return True

    def _kept_out(self, at_share: set[str]) -> frozenset[str]:
        """The peers whose new connections are dropped now: those at their share, and those
        closed for rapid reset within :data:`RESET_WINDOW_S`."""
        now = time.monotonic()
        for host in [h for h, until in self._barred.items() if until <= now]:
            del self._barred[host]
        return frozenset(at_share | self._barred.keys())

    async def _until_next_look(self, *, rest_s: float) -> bool:
        """Sleep ``every_s``, or less when the open descriptors have grown by ``_trigger``
        (but at least ``rest_s``, the last look's time, so looks take at most half of it);
        whether it was less (a flood)."""
        if self.per_peer is None:  # no share: nothing to look at sooner for
            await asyncio.sleep(self.every_s)
            return False
        loop = asyncio.get_running_loop()
        now = loop.time()
        due, earliest = now + self.every_s, now + min(rest_s, self.every_s)
        while (now := loop.time()) < due:
            await asyncio.sleep(min(TRIGGER_CHECK_S, due - now))
            files = sockdiag.open_files()
            self._files_at_look = min(self._files_at_look, files)  # growth from the lowest
            if loop.time() >= earliest and (files >= self._files_at_look + self._trigger or (
                    self._filter and not self._barred.keys() <= self.blocked)):
                return True
        return False

    def _set_filter(self, block: frozenset[str], listeners: list[int]) -> None:
        """Drop new connections from ``block`` on the port's ``listeners`` (in the worker
        thread)."""
        if not self._filter:
            return
        try:
            for fd in listeners:
                synfilter.attach(fd, block)
        except OSError as e:
            self._filter = self._quick = False
            logger.warning("cannot drop new connections of peers at their share on port %d (%s); "
                           "their connections past it are closed instead", self.port, e)
            return
        for host in sorted(block - self.blocked):
            logger.warning("%s holds its share of connections (server.max_connections_per_peer="
                           "%s): its new connections are dropped until it has fewer", host,
                           self.per_peer)
        self.blocked = block

    def _shut_all(self, closing: list[tuple[Socket, str, str]]) -> None:
        """Shut each down and count it (in the worker thread: a server stopping meanwhile
        cancels the wait for it, not the count)."""
        for s, why, reason in closing:
            if shut(s.fd, self.port, s.conn):
                self._log_close(s.conn, why, reason)

    def _judge(self, sockets: list[Socket]) -> list[tuple[Socket, str, str]]:
        """The connections to close now, and the port's state for health."""
        closing: dict[Conn, tuple[Socket, str, str]] = {}
        by_host: dict[str, list[Socket]] = collections.defaultdict(list)
        for s in sockets:
            by_host[s.conn[0]].append(s)
        if self.per_peer is not None:
            self._block = self._kept_out({h for h, mine in by_host.items()
                                          if len(mine) >= self.per_peer})
            for host, mine in by_host.items():
                if len(mine) > self.per_peer:
                    mine.sort(key=lambda s: s.idle_ms, reverse=True)  # the most idle first
                    for s in mine[:len(mine) - self.per_peer]:
                        closing[s.conn] = (s, f"{host} has {len(mine)} connections open, more "
                                              f"than its share (server.max_connections_per_peer="
                                              f"{self.per_peer})", "per_peer")
        parked = {c for c, n in self._waiting.items() if n > self.max_parked}
        received: dict[Conn, int] = {}
        unread_now: dict[Conn, int] = {}
        for s in sockets:
            received[s.conn] = s.received
            new = s.received - self._received.get(s.conn, 0) - self._seen[s.conn]
            unread = unread_now[s.conn] = max(0, self._unread.get(s.conn, 0) + new)
            if unread > self.max_unread:
                closing.setdefault(s.conn, (s, f"{unread / 2**20:.0f} MiB received that were "
                                               "no request (a header block that never ends?)",
                                               "unread"))
            elif s.conn in parked and s.conn in self._parked_before:
                closing.setdefault(s.conn, (s, f"{self._waiting[s.conn]} calls wait for their "
                                               "request message, for two looks in a row",
                                               "waiting"))
        self._received, self._unread, self._parked_before = received, unread_now, parked
        self._seen.clear()
        for conn in [c for c in self._resets if c not in received]:
            del self._resets[conn]
        open_now = len(sockets) - len(closing)
        cap = self.max_connections
        full = (f"{open_now} connections open on port {self.port}, server.max_connections="
                f"{cap}: new connections may be refused" if cap is not None and open_now >= cap
                else None)
        if (full is None) != (self.full is None) and self.on_full_change is not None:
            self.full = full
            self.on_full_change()
        self.full = full
        return list(closing.values())
