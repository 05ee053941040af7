"""Counting each peer's connections on a port from the kernel (reward_server/rpc/sockdiag.py),
against the descriptor-by-descriptor scan, on loopback: 127.0.0.2 and 127.0.0.1 connect to a
listening socket of this process. Linux only."""

from __future__ import annotations

import collections
import socket
import sys

import pytest

from reward_server.rpc import sockdiag, sockscan

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


@pytest.mark.parametrize(("family", "host"), [(socket.AF_INET, "127.0.0.1"),
                                              (socket.AF_INET6, "::")],
                         ids=["ipv4", "dual-stack"])
def test_the_kernels_count_per_peer_is_the_scans(family: socket.AddressFamily, host: str) -> None:
    with socket.socket(family) as srv:
        srv.bind((host, 0))
        srv.listen(64)
        port = srv.getsockname()[1]
        ends = []
        try:
            for i in range(12):
                source = "127.0.0.2" if i % 3 else "127.0.0.1"
                ends.append(socket.create_connection(("127.0.0.1", port),
                                                     source_address=(source, 0)))
                ends.append(srv.accept()[0])
            ends.pop().close()  # one closed on the server's side: no longer counted
            scanned = collections.Counter(s.conn[0] for s in sockscan.scan(port))
            assert scanned == {"127.0.0.2": 7, "127.0.0.1": 4}
            assert sockdiag.peers(port, shared=False) == scanned
            assert sockdiag.peers(port, shared=True) == scanned  # only this process's
        finally:
            for k in ends:
                k.close()


def test_the_open_file_count_follows_new_descriptors() -> None:
    before = sockdiag.open_files()
    if before == 0:
        pytest.skip("this kernel does not give /proc/self/fd a size (Linux < 6.2)")
    socks = [socket.socket() for _ in range(5)]
    try:
        assert sockdiag.open_files() == before + 5
    finally:
        for s in socks:
            s.close()
