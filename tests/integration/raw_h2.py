"""A raw HTTP/2 client (the h2 library over asyncio streams) for calls no gRPC client makes:
headers without a body, a body that never ends."""

from __future__ import annotations

import asyncio
import struct

import h2.config
import h2.connection
import h2.events
import h2.settings


def grpc_frame(message: bytes) -> bytes:
    """A gRPC length-prefixed message (uncompressed)."""
    return struct.pack(">BI", 0, len(message)) + message


def _headers(path: str, metadata: tuple[tuple[str, str], ...]) -> list[tuple[str, str]]:
    return [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "localhost"),
            ("content-type", "application/grpc"), ("te", "trailers"), *metadata]


class RawH2:
    """One HTTP/2 connection to a local server."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.status: dict[int, dict[bytes, bytes]] = {}  # stream -> headers and trailers seen
        self._read_window = True  # False: never open the window again (a non-reading peer)

    @classmethod
    async def open(cls, port: int, *, window: int | None = None) -> RawH2:
        """``window``: the receive window it announces (0: the server may send it no DATA)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        raw = cls(reader, writer)
        if window is not None:
            raw._conn.local_settings = h2.settings.Settings(
                client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
            raw._read_window = False
        raw._conn.initiate_connection()
        await raw._flush()
        return raw

    async def _flush(self) -> None:
        self._writer.write(self._conn.data_to_send())
        await self._writer.drain()

    async def start_call(self, path: str, *, metadata: tuple[tuple[str, str], ...] = (),
                         body: bytes | None = None, end: bool = False) -> int:
        """Open a call: its headers, then (optionally) ``body`` bytes, ended or not."""
        sid = self._conn.get_next_available_stream_id()
        self._conn.send_headers(sid, _headers(path, metadata), end_stream=end and body is None)
        if body is not None:
            self._conn.send_data(sid, body, end_stream=end)
        await self._flush()
        return sid

    async def start_calls(self, path: str, n: int, *, body: bytes,
                          metadata: tuple[tuple[str, str], ...] = ()) -> list[int]:
        """Open ``n`` complete calls at once (all their frames in one write)."""
        sids = []
        for _ in range(n):
            sid = self._conn.get_next_available_stream_id()
            self._conn.send_headers(sid, _headers(path, metadata))
            self._conn.send_data(sid, body, end_stream=True)
            sids.append(sid)
        await self._flush()
        return sids

    async def grpc_status(self, sid: int, timeout_s: float) -> tuple[int, str] | None:
        """(grpc-status, grpc-message) of stream ``sid``, or None if none came in time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while b"grpc-status" not in self.status.get(sid, {}):
            left = deadline - loop.time()
            if left <= 0:
                return None
            try:
                data = await asyncio.wait_for(self._reader.read(65536), left)
            except TimeoutError:
                return None
            if not data:
                return None
            for ev in self._conn.receive_data(data):
                if isinstance(ev, h2.events.ResponseReceived | h2.events.TrailersReceived):
                    self.status.setdefault(ev.stream_id, {}).update(dict(ev.headers))
                elif isinstance(ev, h2.events.DataReceived) and self._read_window:
                    self._conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            await self._flush()
        got = self.status[sid]
        return int(got[b"grpc-status"]), got.get(b"grpc-message", b"").decode()

    async def wait_closed_by_peer(self, timeout_s: float) -> bool:
        """Read (and answer pings) until the server closes the connection: True, or False when
        ``timeout_s`` passed first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (left := deadline - loop.time()) > 0:
            try:
                data = await asyncio.wait_for(self._reader.read(65536), left)
            except TimeoutError:
                return False
            except ConnectionError:
                return True
            if not data:
                return True
            self._conn.receive_data(data)
            try:
                await self._flush()
            except ConnectionError:
                return True
        return False

    async def close(self) -> None:
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except ConnectionError:
            pass
