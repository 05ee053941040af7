"""The one batching stage: concurrent calls merge, big calls split, every caller gets its own
results in order, failures reach every caller of the batch, and a cancelled caller does not
cancel the others."""

import asyncio
from collections.abc import Sequence

import pytest

from reward_server.backends.base import NLIPair
from reward_server.backends.fake import FakeJudge, FakeNLI, fake_p_yes
from reward_server.backends.settings import BatchingSettings
from reward_server.domain import Task
from reward_server.errors import BackendUnavailable, EngineError
from reward_server.rubric.templates import judge_prompt
from reward_server.serving.batching import BatchedJudge, BatchedNLI, Batcher


async def test_concurrent_calls_merge_and_each_gets_its_own_slice() -> None:
    inner = FakeJudge()
    judge = BatchedJudge(inner, BatchingSettings(max_items=1000, wait_ms=20))
    calls = [[judge_prompt("", f"coffee {i}", 'Mentions "coffee".', Task.GENERIC),
              judge_prompt("", f"tea {i}", f'Mentions "{i}".', Task.GENERIC)] for i in range(50)]
    results = await asyncio.gather(*(judge.p_yes(c) for c in calls))
    for i, r in enumerate(results):
        assert r == [fake_p_yes(f"coffee {i}", 'Mentions "coffee".'), fake_p_yes(f"tea {i}", f'Mentions "{i}".')]
    assert sum(inner.batch_sizes) == 100 and max(inner.batch_sizes) > 2
    assert len(inner.batch_sizes) < 50
    assert judge.batcher.stats.items == 100 and judge.batcher.stats.batches == len(inner.batch_sizes)


async def test_full_batches_leave_at_once_and_big_calls_are_split() -> None:
    seen: list[int] = []

    async def fn(xs: Sequence[int]) -> list[int]:
        seen.append(len(xs))
        return [x * 2 for x in xs]

    b: Batcher[int, int] = Batcher(fn, max_items=4, wait_s=10.0)
    out = await asyncio.wait_for(asyncio.gather(*(b.submit([i, i]) for i in range(4))), timeout=2)
    assert out == [[0, 0], [2, 2], [4, 4], [6, 6]]
    assert seen == [4, 4]  # never waited 10 s: each batch was full
    seen.clear()
    big = await asyncio.wait_for(b.submit(list(range(8))), timeout=2)
    assert big == [2 * x for x in range(8)] and seen == [4, 4]


async def test_a_call_can_span_batches_and_share_them() -> None:
    seen: list[list[int]] = []

    async def fn(xs: Sequence[int]) -> list[int]:
        seen.append(list(xs))
        return [x + 100 for x in xs]

    b: Batcher[int, int] = Batcher(fn, max_items=3, wait_s=0.01)
    a, c = await asyncio.gather(b.submit([1, 2]), b.submit([3, 4, 5, 6]))
    assert a == [101, 102] and c == [103, 104, 105, 106]
    assert seen == [[1, 2, 3], [4, 5, 6]]
    assert max(len(s) for s in seen) <= 3


@pytest.mark.parametrize(("raised", "seen"), [
    (IndexError("list index out of range"), EngineError),  # a bug: INTERNAL, not retried
    (MemoryError(), BackendUnavailable),  # infrastructure: UNAVAILABLE, retried
    (ConnectionResetError("peer gone"), BackendUnavailable),
    (BackendUnavailable("replica gone"), BackendUnavailable),
])
async def test_failure_reaches_every_caller_of_the_batch_classified(
    raised: Exception, seen: type[Exception]
) -> None:
    async def boom(xs: Sequence[int]) -> list[int]:
        raise raised

    b: Batcher[int, int] = Batcher(boom, max_items=100, wait_s=0.01, name="judge")
    out = await asyncio.gather(b.submit([1]), b.submit([2]), return_exceptions=True)
    assert all(type(o) is seen for o in out), out
    assert all(o is raised or (o.__cause__ is raised and "judge engine" in str(o)) for o in out)


async def test_wrong_result_count_is_an_error_not_a_shift() -> None:
    async def short(xs: Sequence[int]) -> list[int]:
        return list(xs)[:-1]

    b: Batcher[int, int] = Batcher(short, max_items=100, wait_s=0.0)
    with pytest.raises(EngineError, match="2 results for 3 inputs"):
        await b.submit([1, 2, 3])


async def test_a_cancelled_caller_does_not_cancel_the_batch() -> None:
    async def slow(xs: Sequence[int]) -> list[int]:
        await asyncio.sleep(0.1)
        return [x * 3 for x in xs]

    b: Batcher[int, int] = Batcher(slow, max_items=100, wait_s=0.01)
    doomed = asyncio.create_task(b.submit([1]))
    other = asyncio.create_task(b.submit([2]))
    await asyncio.sleep(0.03)  # both are in the running batch
    doomed.cancel()
    assert await other == [6]
    assert doomed.cancelled()


async def test_nli_wrapper_keeps_order() -> None:
    nli = BatchedNLI(FakeNLI(), BatchingSettings(max_items=64, wait_ms=10))
    pairs = [NLIPair("Paris is big.", "Paris"), NLIPair("Paris is big.", "London")]
    a, b = await asyncio.gather(nli.entailment(pairs), nli.entailment(pairs[::-1]))
    assert [s.entailment for s in a] == [0.98, 0.02]
    assert [s.entailment for s in b] == [0.02, 0.98]
    assert nli.max_length == 512 and nli.model_id == "fake-nli"
    assert (await nli.health()).ok


def test_stats_stay_bounded() -> None:
    from reward_server.serving.batching import RECENT_BATCHES, BatchStats

    s = BatchStats()
    for i in range(RECENT_BATCHES * 3):
        s.record(i % 7 + 1)
    assert len(s.recent) == RECENT_BATCHES and s.batches == RECENT_BATCHES * 3 and s.largest == 7


def test_bad_arguments() -> None:
    async def fn(xs: Sequence[int]) -> list[int]:
        return list(xs)

    with pytest.raises(ValueError):
        Batcher(fn, max_items=0, wait_s=0.0)


async def test_max_in_flight_lets_batches_grow_while_the_engine_is_busy() -> None:
    seen: list[list[int]] = []
    gate = asyncio.Event()

    async def fn(xs: Sequence[int]) -> list[int]:
        seen.append(list(xs))
        if len(seen) == 1:
            await gate.wait()  # the first call holds the only slot
        return [-x for x in xs]

    b: Batcher[int, int] = Batcher(fn, max_items=4, wait_s=0.001, max_in_flight=1)
    first = asyncio.ensure_future(b.submit([0]))
    await asyncio.sleep(0.02)  # the first batch is running
    later = [asyncio.ensure_future(b.submit([i])) for i in range(1, 7)]
    await asyncio.sleep(0.02)  # their wait is long over, yet no call starts while the slot is busy
    assert seen == [[0]]
    gate.set()
    assert await asyncio.wait_for(first, 2) == [0]
    assert [await asyncio.wait_for(f, 2) for f in later] == [[-i] for i in range(1, 7)]
    # 1..4 filled a batch that queued; 5, 6 kept filling the next one, started when a slot freed
    assert seen == [[0], [1, 2, 3, 4], [5, 6]]
    assert b.stats.items == 7


async def test_max_in_flight_none_starts_every_batch_at_its_deadline() -> None:
    running = 0
    most = 0

    async def fn(xs: Sequence[int]) -> list[int]:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.02)
        running -= 1
        return list(xs)

    b: Batcher[int, int] = Batcher(fn, max_items=1, wait_s=0.0)
    assert await asyncio.gather(*(b.submit([i]) for i in range(5))) == [[i] for i in range(5)]
    assert most == 5
    with pytest.raises(ValueError, match="max_in_flight"):
        Batcher(fn, max_items=1, wait_s=0.0, max_in_flight=0)
