"""This process's TCP connections on a local port, descriptor by descriptor (Linux): each one's
peer, the bytes the kernel has received on it and how long it has been idle (``TCP_INFO``),
found among ``/proc/self/fd``; and shutting one down (``shutdown(2)`` on a duplicate, after
checking the duplicate's addresses), so gRPC core sees the connection end as if the peer had
gone. :class:`~reward_server.rpc.connections.ConnectionGuard` acts on them.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass

_TCP_INFO_BYTES = 232
_BYTES_RECEIVED = 128  # offsets in struct tcp_info (linux/tcp.h, Linux >= 4.1)
_LAST_DATA_RECV = 52  # ms since the last data received (u32)

Conn = tuple[str, int]  # the peer's address and port: one connection

__all__ = ["Conn", "Socket", "peer_of", "scan", "shut", "socket_fds"]


def peer_of(peer: str) -> Conn | None:
    """``("127.0.0.1", 54321)`` from gRPC's peer string (``ipv4:127.0.0.1:54321``,
    ``ipv6:[::1]:54321``); None for other transports."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host, _, port = rest.rpartition(":")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        return None


@dataclass(frozen=True)
class Socket:
    fd: int
    conn: Conn
    received: int  # bytes, as the kernel counts them
    idle_ms: int  # since data last arrived


def _normal(address: str) -> str:
    """An IPv4 address seen on an IPv6 socket (``::ffff:1.2.3.4``) as gRPC names it."""
    return address[7:] if address.startswith("::ffff:") and "." in address else address


def _tcp_socket(fd: int, port: int, listeners: list[int] | None = None) -> socket.socket | None:
    """A duplicate of ``fd`` when it is a connected TCP socket on local ``port`` (close it);
    ``fd`` is added to ``listeners`` when it is the port's listening socket."""
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    try:
        if s.type == socket.SOCK_STREAM and s.family in (socket.AF_INET, socket.AF_INET6) \
                and s.getsockname()[1] == port:
            s.getpeername()  # raises for the listening socket
            return s
    except OSError:
        if listeners is not None and _listening(s):
            listeners.append(fd)
    s.close()
    return None


def _listening(s: socket.socket) -> bool:
    try:
        return bool(s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
    except OSError:
        return False


def socket_fds() -> Iterator[tuple[int, int]]:
    """(descriptor, inode) of each of this process's sockets (``/proc/self/fd``, a readlink
    each)."""
    for name in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if link.startswith("socket:["):
            yield int(name), int(link[8:-1])


def scan(port: int, listeners: list[int] | None = None) -> list[Socket]:
    """This process's connected TCP sockets on local ``port`` (and its listening sockets'
    descriptors appended to ``listeners``)."""
    out = []
    for fd, _ in socket_fds():
        s = _tcp_socket(fd, port, listeners)
        if s is None:
            continue
        with s:
            try:
                host, peer_port = s.getpeername()[:2]
                info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES)
            except OSError:
                continue
        received = struct.unpack_from("Q", info, _BYTES_RECEIVED)[0] if len(info) >= 136 else 0
        idle = struct.unpack_from("I", info, _LAST_DATA_RECV)[0]
        out.append(Socket(fd, (_normal(host), peer_port), received, idle))
    return out


def shut(fd: int, port: int, conn: Conn) -> bool:
    """Shut down the connection ``conn`` on local ``port`` whose descriptor is ``fd`` (checked
    first: the descriptor may have been reused since); whether it was."""
    s = _tcp_socket(fd, port)
    if s is None:
        return False
    with s:
        try:
            host, peer_port = s.getpeername()[:2]
            if (_normal(host), peer_port) != conn:
                return False
            s.shutdown(socket.SHUT_RDWR)
            return True
        except OSError:
            return False
