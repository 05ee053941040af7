"""Client-side micro-batching against a real server (fake engines): concurrent 1-item calls on
one client become few Score calls, each caller gets its own results, its own error and its own
deadline."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from reward_server import domain as d
from reward_server.api.rows import extra_info
from reward_server.backends.fake import FakeJudge
from reward_server.client import CoalesceSettings, RewardCallError

from .conftest import running_server

pytestmark = pytest.mark.timeout(60)
RULES = ('The text mentions "coffee".', 'The text mentions "tea".')


def item(i: int, *, item_id: str | None = None, text: str | None = None) -> d.ScoreItem:
    words = ("coffee", "tea", "coffee and tea", "water")[i % 4]
    return d.ScoreItem(item_id or f"u#{i}", d.RubricScoreSpec("ctx", text or f"{words} {i}", RULES))


async def test_concurrent_calls_merge_and_each_caller_gets_its_own_results() -> None:
    # GRPO-shaped: rollouts of one prompt share an id (verl's user#index), so ids repeat
    items = [item(i, item_id=f"user#{i // 8}") for i in range(64)]
    async with running_server() as r:
        async with r.client() as plain:
            want = [(await plain.score([it]))[0] for it in items]
        async with r.client(coalesce=CoalesceSettings(window_s=0.005, max_items=32)) as c:
            got = await asyncio.gather(*(c.score([it]) for it in items))
            sent = c._coalescer.calls_sent if c._coalescer else -1
    def key(res: d.ItemResult) -> tuple[object, ...]:  # all but the timings
        return res.item_id, res.status, res.reward, dict(res.components), res.message

    assert [key(g[0]) for g in got] == [key(w) for w in want]  # same result, own id, own order
    assert {w.reward for w in want} != {want[0].reward}  # the items really differ
    assert 2 <= sent <= 4  # 64 callers, at most 32 items per call


async def test_a_bad_item_fails_only_its_caller() -> None:
    bad = d.ScoreItem("bad", d.RubricScoreSpec("ctx", "coffee", ()))  # no rules: INVALID_ARGUMENT
    async with running_server() as r, r.client(coalesce=CoalesceSettings(window_s=0.01)) as c:
        out = await asyncio.gather(*(c.score([item(i)]) for i in range(6)), c.score([bad]),
                                   *(c.score([item(i), item(i + 100)]) for i in range(6, 9)),
                                   return_exceptions=True)
    errors = [o for o in out if isinstance(o, BaseException)]
    assert len(errors) == 1 and isinstance(errors[0], RewardCallError)
    assert errors[0].code is grpc.StatusCode.INVALID_ARGUMENT and "items[0]" in errors[0].details
    ok = [o for o in out if not isinstance(o, BaseException)]
    assert [len(o) for o in ok] == [1] * 6 + [2] * 3
    assert all(res.status is d.ItemStatus.OK for o in ok for res in o)


async def test_a_merged_caller_keeps_its_own_deadline() -> None:
    async with running_server(judge=FakeJudge(latency_s=3.0)) as r:
        async with r.client(coalesce=CoalesceSettings(window_s=0.01)) as c:
            start = time.monotonic()
            short = asyncio.ensure_future(c.score([item(0)], timeout_s=0.3))
            longer = asyncio.ensure_future(c.score([item(1)], timeout_s=20))
            with pytest.raises(RewardCallError) as e:
                await short
            waited = time.monotonic() - start
            assert e.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
            assert waited < 2.0  # its own deadline (+ 1 s grace), not the merged call's (3 s)
            assert (await longer)[0].status is d.ItemStatus.OK  # the other caller is unaffected


async def test_a_large_call_is_sent_alone_and_a_server_error_reaches_every_merged_caller() -> None:
    judge = FakeJudge()
    async with running_server(judge=judge) as r:
        async with r.client(coalesce=CoalesceSettings(window_s=0.01, max_items=4), max_retries=0) as c:
            assert len(await c.score([item(i) for i in range(4)])) == 4
            assert c._coalescer is not None and c._coalescer.calls_sent == 1
            judge.fail_with = RuntimeError("engine bug")
            out = await asyncio.gather(*(c.score([item(i)]) for i in range(3)), return_exceptions=True)
    assert all(isinstance(o, RewardCallError) and o.code is grpc.StatusCode.INTERNAL for o in out)
    assert len({id(o) for o in out}) == 3  # each caller raises its own copy


NLI_ROW = extra_info(d.NliConstraintsSpec(response="", answer="Paris capital", preference="museums"),
                     user_id="u1", index=0)


async def test_verls_concurrent_compute_score_calls_merge_on_one_client() -> None:
    from reward_server.integrations import verl as rv

    texts = [f"Paris is the capital of France. Rollout {i} likes museums." if i % 2 else f"Rollout {i}."
             for i in range(32)]
    async with running_server() as r:
        try:
            out = await asyncio.gather(*(rv.compute_score("s", t, None, NLI_ROW, reward_server=r.target)
                                         for t in texts))
            alone = await asyncio.gather(*(rv.compute_score("s", t, None, NLI_ROW, reward_server=r.target,
                                                            coalesce_max_items=1) for t in texts[:4]))
            (client,) = [c for c in rv._clients[asyncio.get_running_loop()].values() if c._coalescer]
            assert client._coalescer is not None and client._coalescer.calls_sent <= 3
        finally:
            await rv.close_clients()
    assert [o["score"] for o in out[:4]] == [a["score"] for a in alone]
    assert {o["score"] for o in out[1::2]} != {o["score"] for o in out[::2]}  # each its own


def test_verls_client_cache_is_per_loop_object_and_drops_closed_loops() -> None:
    from reward_server.integrations import verl as rv

    budget = rv.RetryBudget()

    async def get() -> object:
        return rv._client("127.0.0.1:1", None, budget, None)

    first = asyncio.run(get())  # that loop is closed now
    second = asyncio.run(get())
    assert second is not first  # never a dead loop's client, even if the new loop reuses its id()
    assert len([lp for lp in rv._clients if lp.is_closed()]) <= 1  # the first loop's entry went
    assert list(rv._clients)[-1].is_closed()  # the second's goes when a third loop asks
