"""The trimmer gives freed heap back after large calls, and once the server goes idle."""

from __future__ import annotations

import asyncio

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


async def test_large_frees_trim_without_waiting_for_idle() -> None:
    t = Trimmer(after_bytes=4 << 20)
    if t._trim is None:
        pytest.skip("this libc has no malloc_trim")
    t.freed(5 << 20)
    assert await _trims_within(t, 2.0) == 1
