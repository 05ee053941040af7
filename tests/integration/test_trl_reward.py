"""The public TRL reward (reward_server.integrations.trl) called the way TRL's GRPOTrainer calls an
async reward function, against a real server: rewards per completion, components through
log_metric, None for masked completions, and the server's status when not masking."""

from __future__ import annotations

import inspect
import json
import math
from collections import defaultdict

import pytest

from reward_server.client import RetryBudget, RewardCallError
from reward_server.domain import RewardKind
from reward_server.integrations.trl import RewardServerReward
from trainer.data.prepare import build_rows, sample_records, to_trl

from .conftest import running_server


def trl_batch(task: str, n: int, **opts):  # type: ignore[no-untyped-def]
    """What GRPOTrainer passes: the dataset's columns repeated per completion."""
    rows = to_trl(build_rows(sample_records(history_limit=1)[:1], task, history_limit=1, **opts))
    row = rows[0]
    return [row["prompt"]] * n, [row["extra_info_json"]] * n


async def test_trl_reward_scores_and_logs_the_components() -> None:
    prompts, extra = trl_batch("personalized_generator", 3, reward_kind=RewardKind.RUBRIC_SCORE)
    completions = [[{"role": "assistant", "content": t}] for t in
                   ("Honestly, my kids love it.", "It is fine.", "")]
    logged: dict[str, list[float]] = defaultdict(list)
    async with running_server() as r:
        reward = RewardServerReward(r.target)
        assert inspect.iscoroutinefunction(reward.__call__)  # TRL awaits it on its own loop
        out = await reward(prompts, completions, extra_info_json=extra,
                           log_metric=lambda k, v: logged[k].append(v))
        await reward._client_here().close()
    assert len(out) == 3 and all(isinstance(x, float) for x in out)
    assert reward.calls == [3]  # one Score call for the whole generation batch
    assert logged["reward/policy_invalid"] == [pytest.approx(1 / 3)]  # the empty completion
    for key in ("reward/mean_p_yes", "reward/fraction_satisfied", "reward/n_rules", "reward/wait_s"):
        assert len(logged[key]) == 1 and math.isfinite(logged[key][0]), key
    assert logged["reward/masked"] == [0.0]


async def test_trl_reward_masks_or_raises_with_the_servers_status() -> None:
    prompts, extra = trl_batch("rubric_generator", 2)
    completions = [json.dumps([{"rule": "r"}])] * 2
    quick = RetryBudget(attempts=1, deadline_s=1.0)
    masked = RewardServerReward("127.0.0.1:1", retry=quick, mask_infra_failures=True,
                                probe_timeout_s=1.0)
    logged: dict[str, list[float]] = defaultdict(list)
    assert await masked(prompts, completions, extra_info_json=extra,
                        log_metric=lambda k, v: logged[k].append(v)) == [None, None]
    assert masked.masked == 2 and logged["reward/masked"] == [1.0]
    strict = RewardServerReward("127.0.0.1:1", retry=quick, probe_timeout_s=1.0)
    with pytest.raises(RewardCallError) as e:
        await strict(prompts, completions, extra_info_json=extra)
    assert e.value.code.name == "UNAVAILABLE" and "Connection refused" in e.value.details


async def test_trl_reward_says_which_column_is_missing() -> None:
    reward = RewardServerReward("127.0.0.1:1")
    with pytest.raises(ValueError, match="no 'extra_info_json' column"):
        await reward(["p"], ["c"])
