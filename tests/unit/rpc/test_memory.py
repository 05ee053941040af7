"""The trimmer gives freed heap back after large calls, and once the server goes idle."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest

from reward_server.rpc import memory
from reward_server.rpc.memory import Trimmer


async def _trims_within(t: Trimmer, seconds: float) -> int:
    end = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < end and not t.trims:
        await asyncio.sleep(0.05)
    await asyncio.sleep(memory.DELAY_S + 0.1)  # the collection's delay, then the trim itself
    return t.trims


async def test_idle_trims_once_calls_moved_a_megabyte() -> None:
    t = Trimmer()
    if t._trim is None:
        pytest.skip("this libc has no malloc_trim")
    t.freed(memory.TRIM_IDLE_BYTES // 2)
    t.idle()  # half a megabyte, RSS as it was: nothing to give back
    assert await _trims_within(t, 0.5) == 0
    t.freed(memory.TRIM_IDLE_BYTES)
    t.idle()
    assert await _trims_within(t, 2.0) == 1


async def test_an_idle_trim_waits_for_a_server_that_got_busy_again() -> None:
    """Idle when asked for, calls in flight again when it would start: its full collection
    is not run under them (it would hold the event loop); the next idle moment asks again."""
    import gc

    busy = False
    t = Trimmer(busy=lambda: busy)
    if t._trim is None:
        pytest.skip("this libc has no malloc_trim")
    full: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(1)

    gc.callbacks.append(seen)
    try:
        t.freed(memory.TRIM_IDLE_BYTES)
        t.idle()
        busy = True  # a call arrives before the trim's delay is over
        assert await _trims_within(t, memory.DELAY_S + 0.5) == 0
        assert not full
        busy = False  # the last call in flight ended
        t.idle()
        assert await _trims_within(t, 2.0) == 1
        assert full
    finally:
        gc.callbacks.remove(seen)


async def test_large_frees_trim_without_waiting_for_idle() -> None:
    t = Trimmer(after_bytes=4 << 20)
    if t._trim is None:
        pytest.skip("this libc has no malloc_trim")
    t.freed(5 << 20)
    assert await _trims_within(t, 2.0) == 1


async def test_an_idle_server_gives_back_memory_that_grew_without_a_call() -> None:
    """Memory that grew with no call ending (connections that never made one, a body refused
    while it was read) is trimmed by the watch while nothing is in flight, not at the next
    call; while calls are in flight the watch leaves it to them."""
    t = Trimmer()
    if t._trim is None:
        pytest.skip("this libc has no malloc_trim")
    busy = True
    watch = asyncio.ensure_future(t.watch(lambda: busy, every_s=0.05))
    try:
        # twice the growth the watch looks for (8 MiB, or 5 % of a large process: a full test
        # run's process holds torch and more) of heap ...
        grow = 2 * max(8 * memory.TRIM_IDLE_BYTES, memory._rss() // 20)
        held = [bytes(2048) for _ in range(grow // 2048)]
        top = held[-1]  # ... freed but for its last block: glibc cannot shrink the heap
        del held  # past it by itself, malloc_trim gives back the pages under it
        assert await _trims_within(t, 0.5) == 0  # busy: not the watch's business
        busy = False
        assert await _trims_within(t, 2.0) == 1
        assert await _trims_within(t, 0.5) == 1  # the RSS it left is the new floor
    finally:
        watch.cancel()
    assert len(top) == 2048


async def test_an_idle_server_gives_back_heap_freed_without_a_call() -> None:
    """Memory freed with no call ending and no growth seen (gRPC's state of connections that
    closed, allocated before the last trim) is trimmed once glibc holds 8 MiB more free."""
    size = 3 * 8 * memory.TRIM_IDLE_BYTES
    held = [bytes(2048) for _ in range(size // 2048)]
    t = Trimmer()  # its floors: the RSS and the free heap with these held
    if t._trim is None or t._heap_free is None:
        pytest.skip("this libc has no malloc_trim or mallinfo2")
    watch = asyncio.ensure_future(t.watch(lambda: False, every_s=0.05))
    try:
        assert await _trims_within(t, 0.3) == 0  # nothing freed yet
        top = held[-1]  # glibc cannot shrink the heap past it by itself
        del held
        assert await _trims_within(t, 2.0) == 1
        assert top
    finally:
        watch.cancel()


async def test_an_idle_trim_asked_for_during_another_trim_runs_after_it() -> None:
    """A large body's call ends (idle) while the trim its bytes scheduled is under way: the idle
    trim (a full collection first) follows that one at once, not at the watch's next look."""
    busy = False
    t = Trimmer(after_bytes=4 << 20, busy=lambda: busy)
    if t._trim is None:
        pytest.skip("this libc has no malloc_trim")
    t.freed(5 << 20)  # schedules a trim ...
    t.idle()  # ... so this one is asked for while it is scheduled
    assert await _trims_within(t, 2.0) == 1
    end = asyncio.get_running_loop().time() + 2.0
    while asyncio.get_running_loop().time() < end and t.trims < 2:
        await asyncio.sleep(0.05)
    assert t.trims == 2  # no watch runs here: only the trim that was done asked for it

    busy = True  # calls in flight: the end of the last one asks again, not the trim
    t.freed(5 << 20)
    t.idle()
    await asyncio.sleep(memory.MIN_INTERVAL_S + 2 * memory.DELAY_S + 0.3)
    assert t.trims == 3
    await asyncio.sleep(memory.MIN_INTERVAL_S + 0.3)
    assert t.trims == 3


def test_a_fixed_mmap_threshold_keeps_large_buffers_out_of_the_heap() -> None:
    """glibc raises its mmap threshold to the size of each mapped block freed, so after one
    16 MiB buffer an 8 MiB one comes from the heap, where it stays resident once freed. Fixed
    at 128 KiB (the server's default), the 8 MiB buffer gets its own mapping again, and gives it
    back when freed. Run in a fresh interpreter: a long-lived process's heap may hold a free
    chunk that large already, which malloc reuses whatever the threshold."""
    if memory._libc_function("mallinfo2") is None or memory._libc_function("mallopt") is None:
        pytest.skip("not glibc >= 2.33 (no mallopt / mallinfo2)")
    script = textwrap.dedent("""
        from reward_server.rpc import memory
        info = memory._libc_function("mallinfo2")
        info.argtypes, info.restype = [], memory._MallInfo2
        big = bytearray(16 << 20)
        del big  # with glibc's default, the threshold is now 16 MiB
        assert not memory.fix_mmap_threshold(None)  # None: glibc's behaviour left alone
        assert memory.fix_mmap_threshold(128 * 1024)
        before = info().hblkhd
        buf = bytearray(8 << 20)
        grown = info().hblkhd - before
        del buf
        print(grown, info().hblkhd - before)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    grown, after = int(out[0]), int(out[1])
    assert grown >= 8 << 20  # its own mapping
    assert after <= 64 << 10  # unmapped when freed: back to the system


async def test_a_trim_under_load_does_not_move_the_level_an_idle_server_compares_with() -> None:
    """A trim that ran while calls held their memory does not become the rest level: once the
    server is idle with its RSS still 8 MiB (or 5 %) above what the last idle trim left, it
    trims once, and what that trim left is the new level (it does not trim again for memory
    still in use). Above the lowest level, an RSS that moved a megabyte since is trimmed
    once more."""
    busy = True
    t = Trimmer(after_bytes=512 * 1024, busy=lambda: busy)  # rest level: the RSS now
    if t._trim is None:
        pytest.skip("this libc has no malloc_trim")
    grow = 2 * max(8 * memory.TRIM_IDLE_BYTES, memory._rss() // 20)
    held = [bytes(2048) for _ in range(grow // 2048)]  # the calls' memory, in use
    t.freed(600 * 1024)  # under a megabyte moved, past after_bytes: a trim under load
    assert await _trims_within(t, 2.0) == 1
    busy = False
    watch = asyncio.ensure_future(t.watch(lambda: busy, every_s=0.05))
    try:
        end = asyncio.get_running_loop().time() + memory.MIN_INTERVAL_S + 1.0
        while asyncio.get_running_loop().time() < end and t.trims < 2:
            await asyncio.sleep(0.05)
        assert t.trims == 2  # compared with the level before the load, not the load's trim
        await asyncio.sleep(memory.MIN_INTERVAL_S + 2 * memory.DELAY_S + 0.3)
        assert t.trims == 2  # the idle trim's RSS is the level now: held memory is not trimmed for
        # above the lowest level an idle trim left, the RSS moves by 3 MiB (under the 8 MiB of
        # growth, with nothing new free): memory came or went since that trim, so once more
        more = [bytes(2048) for _ in range(3 * memory.TRIM_IDLE_BYTES // 2048)]
        end = asyncio.get_running_loop().time() + memory.MIN_INTERVAL_S + 1.0
        while asyncio.get_running_loop().time() < end and t.trims < 3:
            await asyncio.sleep(0.05)
        assert t.trims == 3
        await asyncio.sleep(memory.MIN_INTERVAL_S + 2 * memory.DELAY_S + 0.3)
        assert t.trims == 3  # and not again while it holds still
    finally:
        watch.cancel()
    assert len(held) == grow // 2048 and more


def test_tcache_env_adds_the_tunable_once_and_keeps_the_operators() -> None:
    if not memory._is_glibc():
        assert memory.tcache_env({}, 0) is None
        pytest.skip("not glibc: nothing to set")
    env = memory.tcache_env({"PATH": "/bin"}, 0)
    assert env == {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}
    # other tunables are kept; the restarted process finds it there and does not restart again
    env = memory.tcache_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, 3)
    assert env is not None and env["GLIBC_TUNABLES"] == (
        "glibc.malloc.arena_max=2:glibc.malloc.tcache_count=3")
    assert memory.tcache_env(env, 0) is None
    # the operator's own value wins; None asks for glibc's default
    assert memory.tcache_env({"GLIBC_TUNABLES": "glibc.malloc.tcache_count=7"}, 0) is None
    assert memory.tcache_env({"PATH": "/bin"}, None) is None


def test_serve_that_cannot_start_again_serves_on_with_a_warning(monkeypatch, caplog) -> None:
    from reward_server import cli
    from reward_server.config import load_config

    if not memory._is_glibc():
        pytest.skip("not glibc: serve never starts again")
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    tried = []

    def execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        tried.append(env["GLIBC_TUNABLES"])
        raise PermissionError("not allowed here")

    monkeypatch.setattr(cli.os, "execve", execve)
    with caplog.at_level("WARNING"):
        cli._restart_with_malloc_tunables(load_config())  # returns: serving goes on
    assert tried == ["glibc.malloc.tcache_count=0"]
    assert "could not start again with GLIBC_TUNABLES" in caplog.text
    tried.clear()
    cli._restart_with_malloc_tunables(load_config(overrides=["server.malloc_tcache_count=null"]))
    assert tried == []  # glibc's default asked: no restart
