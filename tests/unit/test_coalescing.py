import asyncio
from collections.abc import Sequence

import pytest

from reward_server.backends.base import JudgePrompt, NLIPair
from reward_server.backends.batching import Coalescer, CoalescingJudge, CoalescingNLI
from reward_server.backends.fake import FakeJudge, FakeNLI, fake_p_yes


def prompt(text: str, rule: str) -> JudgePrompt:
    return JudgePrompt(system="s", prefix=text, suffix=rule, context="", text=text, rule=rule)


async def test_concurrent_calls_merge_and_each_gets_its_own_slice() -> None:
    inner = FakeJudge()
    judge = CoalescingJudge(inner, max_batch=1000, max_wait_s=0.02)
    calls = [[prompt(f"coffee {i}", 'Mentions "coffee".'), prompt(f"tea {i}", f'Mentions "{i}".')]
             for i in range(50)]
    results = await asyncio.gather(*(judge.p_yes(c) for c in calls))
    for c, r in zip(calls, results, strict=True):
        assert r == [fake_p_yes(p.text, p.rule) for p in c]
    assert sum(inner.batch_sizes) == 100 and max(inner.batch_sizes) > 2
    assert len(inner.batch_sizes) < 50


async def test_max_batch_flushes_early() -> None:
    seen: list[int] = []

    async def fn(xs: Sequence[int]) -> list[int]:
        seen.append(len(xs))
        return [x * 2 for x in xs]

    c: Coalescer[int, int] = Coalescer(fn, max_batch=4, max_wait_s=10.0)
    out = await asyncio.wait_for(asyncio.gather(*(c.submit([i, i]) for i in range(4))), timeout=2)
    assert out == [[0, 0], [2, 2], [4, 4], [6, 6]]
    assert seen == [4, 4]


async def test_failure_reaches_every_caller_of_the_merged_call() -> None:
    async def boom(xs: Sequence[int]) -> list[int]:
        raise RuntimeError("engine died")

    c: Coalescer[int, int] = Coalescer(boom, max_batch=100, max_wait_s=0.01)
    out = await asyncio.gather(c.submit([1]), c.submit([2]), return_exceptions=True)
    assert all(isinstance(o, RuntimeError) for o in out)


async def test_nli_wrapper_keeps_order() -> None:
    nli = CoalescingNLI(FakeNLI(), max_batch=64, max_wait_s=0.01)
    pairs = [NLIPair("Paris is big.", "Paris"), NLIPair("Paris is big.", "London")]
    a, b = await asyncio.gather(nli.entailment(pairs), nli.entailment(pairs[::-1]))
    assert [s.entailment for s in a] == [0.98, 0.02]
    assert [s.entailment for s in b] == [0.02, 0.98]
    assert nli.max_length == 512 and nli.model_id == "fake-nli"


def test_bad_arguments() -> None:
    async def fn(xs: Sequence[int]) -> list[int]:
        return list(xs)

    with pytest.raises(ValueError):
        Coalescer(fn, max_batch=0, max_wait_s=0.0)
