"""How many connections each peer holds on a local port, from the kernel in one request (Linux).

:func:`~reward_server.rpc.sockscan.scan` looks at every descriptor (about 20 us each), too
slow to notice a flood of new connections before thousands are in. The kernel's socket
diagnostics (``NETLINK_SOCK_DIAG``, what ``ss`` reads; no privilege needed) list the TCP
connections of a local port with their peer address and inode in one dump. Only this process
can have connections on a port it listens on, unless processes share it (``server.reuse_port``):
then only the inodes of this process's descriptors (``/proc/self/fd``, a readlink each, most of
the time taken) are counted.
"""

from __future__ import annotations

import collections
import os
import socket
import struct

from reward_server.rpc.sockscan import socket_fds

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_INET_DIAG_REQ_BYTECODE = 1
_BC_S_GE, _BC_S_LE = 2, 3  # inet_diag bytecode: local port >= / <= the next op's "no"
_STATES = (1 << 1) | (1 << 8)  # ESTABLISHED, CLOSE_WAIT (the peer has closed, we have not)
_MSG_BYTES = 72  # struct inet_diag_msg
_DST, _INODE = 24, 68  # its peer address (16 bytes) and inode (u32)
_V4_MAPPED = bytes(10) + b"\xff\xff"


def _request(family: int, port: int) -> bytes:
    """A dump request for ``family``'s TCP connections whose local port is ``port``."""
    # the filter: sport >= port, then sport <= port; a "no" past the end rejects (as ss does)
    ops = struct.pack("=BBH", _BC_S_GE, 8, 20) + struct.pack("=BBH", 0, 0, port) \
        + struct.pack("=BBH", _BC_S_LE, 8, 12) + struct.pack("=BBH", 0, 0, port)
    attr = struct.pack("=HH", 4 + len(ops), _INET_DIAG_REQ_BYTECODE) + ops
    req = struct.pack("=BBBxI", family, socket.IPPROTO_TCP, 0, _STATES) + bytes(48)
    body = req + attr
    return struct.pack("=IHHII", 16 + len(body), _SOCK_DIAG_BY_FAMILY,
                       _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0) + body


def _dump(family: int, port: int) -> list[tuple[str, int]]:
    """(peer address, inode) of ``family``'s TCP connections on local ``port``."""
    out: list[tuple[str, int]] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
        nl.sendall(_request(family, port))
        while True:
            data = nl.recv(1 << 20)
            offset = 0
            while offset + 16 <= len(data):
                length, kind = struct.unpack_from("=IH", data, offset)
                if kind == _NLMSG_DONE:
                    return out
                if kind == _NLMSG_ERROR:
                    errno = -struct.unpack_from("=i", data, offset + 16)[0]
                    raise OSError(errno, f"sock_diag: {os.strerror(errno)}")
                if kind == _SOCK_DIAG_BY_FAMILY and length >= 16 + _MSG_BYTES:
                    msg = offset + 16
                    dst = data[msg + _DST:msg + _DST + 16]
                    if data[msg] == socket.AF_INET:
                        peer = socket.inet_ntop(socket.AF_INET, dst[:4])
                    elif dst[:12] == _V4_MAPPED:
                        peer = socket.inet_ntop(socket.AF_INET, dst[12:])
                    else:
                        peer = socket.inet_ntop(socket.AF_INET6, dst)
                    out.append((peer, struct.unpack_from("=I", data, msg + _INODE)[0]))
                if length < 16:
                    return out
                offset += (length + 3) & ~3
            if not data:
                return out


def open_files() -> int:
    """The process's open descriptors (Linux >= 6.2 gives the count as the size of
    /proc/self/fd, a few microseconds; 0 elsewhere)."""
    try:
        return os.stat("/proc/self/fd").st_size
    except OSError:
        return 0


def peers(port: int, *, shared: bool) -> collections.Counter[str]:
    """How many connections each peer address holds on local ``port`` (IPv4 peers of a
    dual-stack socket by their IPv4 address); ``shared``: other processes listen on it too,
    count only this one's. Raises OSError where the kernel's socket diagnostics are not
    available."""
    mine = {inode for _, inode in socket_fds()} if shared else None
    counts: collections.Counter[str] = collections.Counter()
    for family in (socket.AF_INET, socket.AF_INET6):
        for peer, inode in _dump(family, port):
            if mine is None or inode in mine:
                counts[peer] += 1
    return counts
