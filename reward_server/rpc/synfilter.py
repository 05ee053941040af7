"""New connections from given addresses dropped by the kernel, before gRPC accepts them (Linux).

gRPC core accepts every connection up to its cap and keeps a handle for each one it has ever had
open at once (its epoll poller's free list, never freed), so a peer that opens thousands of
connections leaves memory behind even after :class:`~reward_server.rpc.connections.ConnectionGuard`
has closed them. Past its share, a peer's new connections are therefore stopped in the kernel: a
classic BPF socket filter (``SO_ATTACH_FILTER``, no privilege needed) on the port's listening
sockets drops the connection requests (TCP SYN without ACK) whose source is one of the blocked
addresses. The peer's kernel retries them (after 1, 3, 7 ... s) and one gets in once the peer
is below its share again, when the filter is lifted; packets of connections already open pass,
every other address's too. The same as a firewall's per-address connection limit, set by the
server itself.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import socket
import struct
from collections.abc import Iterable

MAX_BLOCKED = 256  # addresses in one filter (each v4 address 2 instructions, v6 9; limit 4,096)
_SO_ATTACH_FILTER, _SO_DETACH_FILTER = 26, 27  # asm-generic/socket.h
_NET = -0x100000  # SKF_NET_OFF: offsets from the IP header (the filter runs at the TCP header)
_ACCEPT, _DROP = 0xFFFFFFFF, 0
# classic BPF opcodes (linux/filter.h)
_LDB, _LDW, _AND, _RSH = 0x30, 0x20, 0x54, 0x74  # ld byte/word abs; alu and/rsh k
_JA, _JEQ, _RET = 0x05, 0x15, 0x06


def _op(code: int, k: int = 0, *, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k & 0xFFFFFFFF)


def program(addresses: Iterable[str]) -> bytes:
    """The filter's instructions: drop a TCP SYN (no ACK) from any of ``addresses`` (IPv4 or
    IPv6; an IPv4 address seen on a dual-stack socket arrives as IPv4), accept everything else."""
    v4: list[ipaddress.IPv4Address] = []
    v6: list[ipaddress.IPv6Address] = []
    for a in addresses:
        ip = ipaddress.ip_address(a)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if isinstance(ip, ipaddress.IPv4Address):
            v4.append(ip)
        else:
            v6.append(ip)
    ops = [
        _op(_LDB, 13),  # the TCP header's flags
        _op(_AND, 0x12),  # SYN | ACK
        _op(_JEQ, 0x02, jt=1),  # a connection request: look at its source
        _op(_RET, _ACCEPT),
        _op(_LDB, _NET),  # IP version
        _op(_RSH, 4),
        _op(_JEQ, 4, jt=1),
    ]
    block4 = [_op(_LDW, _NET + 12)]  # IPv4 source address
    for ip in v4:
        block4 += [_op(_JEQ, int(ip), jf=1), _op(_RET, _DROP)]
    block4.append(_op(_RET, _ACCEPT))
    ops.append(_op(_JA, len(block4)))  # IPv6: past the IPv4 block
    ops += block4
    for ip in v6:  # the source address's four words at IP header + 8; on a mismatch, the next
        words = struct.unpack("!4I", ip.packed)
        for i, w in enumerate(words):
            ops += [_op(_LDW, _NET + 8 + 4 * i), _op(_JEQ, w, jf=7 - 2 * i)]
        ops.append(_op(_RET, _DROP))
    ops.append(_op(_RET, _ACCEPT))
    return b"".join(ops)


def attach(fd: int, addresses: Iterable[str]) -> None:
    """Drop new connections from ``addresses`` on the listening socket ``fd`` (none: lift the
    filter); the first :data:`MAX_BLOCKED` of them. Raises OSError where the kernel refuses."""
    blocked = sorted(addresses)[:MAX_BLOCKED]
    with socket.socket(fileno=os.dup(fd)) as s:  # the filter belongs to the socket, not the fd
        if not blocked:
            try:
                s.setsockopt(socket.SOL_SOCKET, _SO_DETACH_FILTER, 0)
            except OSError:  # ENOENT: none attached
                pass
            return
        code = program(blocked)
        buf = ctypes.create_string_buffer(code, len(code))
        fprog = struct.pack("HL", len(code) // 8, ctypes.addressof(buf))  # struct sock_fprog
        s.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, fprog)
