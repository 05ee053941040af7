"""RewardServerReward.prefetch (what trainer.trl_runner's GRPOTrainer subclass calls right after
generation), driven the way TRL drives it: prefetch from the training thread onto TRL's reward
loop in a daemon thread, then TRL's own call on that loop. Against a real server: one Score call,
the same rewards as an unprefetched call, the call's time split into the trainer's wait and the
whole call; other completions are scored afresh; errors reach TRL's call."""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from collections.abc import Iterator

import pytest

from reward_server.client import RetryBudget, RewardCallError
from reward_server.domain import RewardKind
from reward_server.integrations.trl import RewardServerReward

from .conftest import running_server
from .test_trl_reward import trl_batch

COMPLETIONS = [[{"role": "assistant", "content": t}] for t in
               ("Honestly, my kids love it.", "It is fine.", "Great price, sturdy and quiet.")]


@pytest.fixture
def trl_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A running loop in a daemon thread, as GRPOTrainer starts for async reward functions."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def trl_call(loop, reward, prompts, completions, **kwargs):  # type: ignore[no-untyped-def]
    """TRL's _calculate_rewards: run the async reward on its loop, block for the result."""
    return asyncio.run_coroutine_threadsafe(reward(prompts, completions, **kwargs), loop).result(60)




async def test_prefetch_is_the_call_trl_then_makes(trl_loop) -> None:  # type: ignore[no-untyped-def]
    prompts, extra = trl_batch("personalized_generator", 3, reward_kind=RewardKind.RUBRIC_SCORE)
    logged: dict[str, list[float]] = defaultdict(list)
    async with running_server() as r:
        plain = RewardServerReward(r.target)
        expected = await asyncio.to_thread(trl_call, trl_loop, plain, prompts, COMPLETIONS,
                                           extra_info_json=extra)
        plain.close()
        reward = RewardServerReward(r.target)
        reward.prefetch(trl_loop, prompts, COMPLETIONS, extra_info_json=extra)
        out = await asyncio.to_thread(trl_call, trl_loop, reward, prompts, COMPLETIONS,
                                      extra_info_json=extra, log_metric=lambda k, v: logged[k].append(v))
        reward.close()
    assert out == expected
    assert reward.calls == [3] and reward.prefetch_hits == 1  # one Score call, the prefetched one
    assert len(logged["reward/wait_s"]) == 1 and len(logged["reward/score_s"]) == 1
    # the wait also covers the result's hand-off from the Score call's task to the waiting
    # call (a loop callback), which score_s, timed inside the call, does not: a fresh-machine
    # run measured 14.85 ms waited against 14.78 ms scored
    assert 0.0 <= logged["reward/wait_s"][0] <= logged["reward/score_s"][0] + 0.05
    assert reward.wait_s == logged["reward/wait_s"]
    for key in ("reward/mean_p_yes", "reward/policy_invalid", "reward/masked"):
        assert len(logged[key]) == 1, key  # the components reach TRL's log_metric once


async def test_prefetch_for_other_completions_is_dropped(trl_loop) -> None:  # type: ignore[no-untyped-def]
    prompts, extra = trl_batch("personalized_generator", 3, reward_kind=RewardKind.RUBRIC_SCORE)
    async with running_server() as r:
        plain = RewardServerReward(r.target)
        expected = await asyncio.to_thread(trl_call, trl_loop, plain, prompts, COMPLETIONS,
                                           extra_info_json=extra)
        plain.close()
        reward = RewardServerReward(r.target)
        reward.prefetch(trl_loop, prompts, COMPLETIONS[::-1], extra_info_json=extra)
        out = await asyncio.to_thread(trl_call, trl_loop, reward, prompts, COMPLETIONS,
                                      extra_info_json=extra)
        reward.close()
    assert out == expected and reward.prefetch_hits == 0


async def test_prefetch_failure_reaches_trls_call(trl_loop) -> None:  # type: ignore[no-untyped-def]
    prompts, extra = trl_batch("rubric_generator", 2)
    completions = ['[{"rule": "r"}]'] * 2
    reward = RewardServerReward("127.0.0.1:1", retry=RetryBudget(attempts=1, deadline_s=1.0))
    reward.prefetch(trl_loop, prompts, completions, extra_info_json=extra)
    with pytest.raises(RewardCallError) as e:
        await asyncio.to_thread(trl_call, trl_loop, reward, prompts, completions, extra_info_json=extra)
    assert e.value.code.name == "UNAVAILABLE" and reward.prefetch_hits == 1
    reward.close()
