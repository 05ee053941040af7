"""Finite logs on every door: a batch holding a policy-invalid sample (its components not
computed) goes through gRPC, the HTTP door's OpenRLHF route, the TRL reward and verl's
compute_score (fake engines), and each framework's own averaging of what it logs stays finite.

How each framework averages (read from their code):
- OpenRLHF 0.11: ``extra_logs[k]`` lists are stacked and reduced with a plain ``.mean()``;
- TRL: ``log_metric`` values are summed and divided by their count per step;
- verl: ``reward_extra_info[k]`` lists (keys of the first result, same keys on every sample)
  are reduced with ``np.mean`` in its validation metrics; our replay buffer's step metrics
  (:func:`reward_server.integrations.verl_sampler.step_metrics`) in training.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio

from reward_server import components
from reward_server import domain as d
from reward_server.api.rows import read_row
from reward_server.integrations import verl as rverl
from reward_server.integrations.trl import RewardServerReward
from trainer.data.prepare import build_rows, sample_records, to_trl

from .conftest import Running, running_server

RULES = ('The text mentions "coffee".', 'The text mentions "tea".')
VALID, INVALID = "I drink coffee and tea", ""  # an empty output is policy-invalid


@pytest_asyncio.fixture(scope="module")
async def server() -> AsyncIterator[Running]:
    async with running_server(["server.http.port=0"]) as r:
        yield r


def extra_info() -> dict[str, Any]:
    rows = to_trl(build_rows(sample_records(history_limit=1)[:1], "personalized_generator",
                             history_limit=1, reward_kind=d.RewardKind.RUBRIC_SCORE))
    info: dict[str, Any] = json.loads(rows[0]["extra_info_json"])
    assert read_row(info).kind is d.RewardKind.RUBRIC_SCORE
    return info


def assert_finite(logs: dict[str, float], door: str) -> None:
    bad = {k: v for k, v in logs.items() if not math.isfinite(v)}
    assert not bad, f"{door}: not finite {bad}"


async def test_grpc_reply_leaves_out_what_a_policy_invalid_sample_did_not_compute(
    server: Running,
) -> None:
    items = [d.ScoreItem(i, d.RubricScoreSpec(context="c", text=t, rules=RULES))
             for i, t in (("ok", VALID), ("bad", INVALID))]
    async with server.client() as c:
        ok, bad = await c.score(items)
    assert (ok.status, bad.status) == (d.ItemStatus.OK, d.ItemStatus.POLICY_INVALID)
    for r in (ok, bad):
        assert r.reward is not None and math.isfinite(r.reward)
        assert_finite(dict(r.components), "gRPC")
    assert "mean_p_yes" in ok.components and "mean_p_yes" not in bad.components  # absent


async def test_openrlhf_extra_logs_average_finite_with_a_policy_invalid_sample(
    server: Running,
) -> None:
    label = json.dumps({"rubric_score": {"context": "c", "rules": list(RULES)}})
    body = {"query": [f"Q: {VALID}", f"Q: {INVALID}"], "prompts": ["Q: ", "Q: "],
            "labels": [label, label]}
    url = f"http://127.0.0.1:{server.app.http_port}/openrlhf/reward"
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as resp:
        assert resp.status == 200
        # strict JSON: a NaN would not even parse
        answer = json.loads(await resp.text(), parse_constant=lambda c: pytest.fail(c))
    logs = answer["extra_logs"]
    assert logs["policy_invalid"] == [0.0, 1.0]
    averaged = {k: float(np.mean(np.asarray(v, dtype=np.float64))) for k, v in logs.items()}
    assert_finite(averaged, "OpenRLHF extra_logs")
    # the mask recovers the mean over the samples a component applies to
    assert logs["mean_p_yes_mask"] == [1.0, 0.0]
    assert averaged["mean_p_yes"] / averaged["mean_p_yes_mask"] == pytest.approx(logs["mean_p_yes"][0])
    assert all(len(v) == 2 for v in logs.values())  # equal-length lists per key


async def test_trl_log_metric_averages_finite_with_a_policy_invalid_sample(server: Running) -> None:
    info = json.dumps(extra_info())
    pending: dict[str, list[float]] = defaultdict(list)
    reward = RewardServerReward(server.target, probe_timeout_s=5.0)
    out = await reward(["p", "p"], [VALID, INVALID], extra_info_json=[info, info],
                       log_metric=lambda k, v: pending[k].append(v))
    await reward._client_here().close()
    assert len(out) == 2 and all(isinstance(x, float) and math.isfinite(x) for x in out)
    # TRL: sum(values) / len(values) per name and step
    averaged = {k: sum(v) / len(v) for k, v in pending.items()}
    assert_finite(averaged, "TRL log_metric")
    assert averaged["reward/policy_invalid"] == pytest.approx(0.5)
    assert "reward/mean_p_yes" in averaged  # over the valid completion only


async def test_verl_reward_extra_info_averages_finite_with_a_policy_invalid_sample(
    server: Running,
) -> None:
    info = extra_info()
    results = [await rverl.compute_score("src", text, None, info, reward_server=server.target,
                                         probe_timeout_s=5.0)
               for text in (VALID, INVALID)]
    await rverl.close_clients()
    assert [r["policy_invalid"] for r in results] == [0.0, 1.0]
    keys = list(results[0])  # verl: the first result's keys, the same on every sample
    assert all(list(r) == keys for r in results)
    for name in read_row(info).component_names:
        assert name in keys and name + components.MASK_SUFFIX in keys
    extra = {k: [r[k] for r in results] for k in keys}
    averaged = {k: float(np.mean(v)) for k, v in extra.items()}  # verl's np.mean
    assert_finite(averaged, "verl reward_extra_info")
    assert extra["mean_p_yes_mask"] == [1.0, 0.0]
    try:
        from reward_server.integrations.verl_sampler import step_metrics
    except ImportError:  # verl / transfer_queue not installed: the framework's own mean suffices
        return
    step = step_metrics(results)
    assert_finite(step, "verl step metrics")
    assert step["reward/mean_p_yes"] == pytest.approx(results[0]["mean_p_yes"])  # valid only
