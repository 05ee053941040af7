"""The step's reward part inside verl's own v1 trainer, where verl runs it: the TaskRunner actor
started by verl's ``run_ppo`` with the runtime env our runner configures (see
verl_taskrunner_probe.py). On trajectories scored by our ``compute_score`` against a real server
(one of them masked: its server unreachable):

- ``grpo_masked`` is registered in that actor by ``VERL_USE_EXTERNAL_MODULES`` alone, and verl's
  ``_compute_advantage`` computes the hand-computed GRPO advantages with and without a masked
  sample (masked: advantage 0, left out of its group's mean and std);
- every metric verl's ``_compute_metrics`` reports is finite with a masked sample in the batch
  (through verl's own replay buffer ``critic/score/*`` turn NaN), and ``critic/score/mean`` is
  the mean of the unmasked scores;
- the reward's components are in the step's metrics (``reward/s_target``, ...), every step.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl", reason="verl is the train extra: pip install -e .[train]")

from reward_server.integrations import verl as rv
from trainer.data.prepare import build_rows, sample_records

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(400)]  # verl's run_ppo: a Ray of its own
PROBE = Path(__file__).with_name("verl_taskrunner_probe.py")
RULES = ('[{"rule": "The review opens with the word \\"Honestly\\"."}, '
         '{"rule": "The review mentions \\"my kids\\" using the product."}]')
OTHER = ('[{"rule": "The review opens with the word \\"Honestly\\"."}, '
         '{"rule": "The review mentions the word \\"battery\\"."}]')


def scored(target: str, rows: list[dict], outputs: list[str], *, masked: set[int]) -> list[dict]:
    async def all_() -> list[dict]:
        out = []
        try:
            for i, (row, text) in enumerate(zip(rows, outputs, strict=True)):
                where = {"reward_server": "127.0.0.1:1", "deadline_s": 1.0, "attempts": 1,
                         "mask_infra_failures": True} if i in masked else {"reward_server": target}
                out.append(await rv.compute_score(row["data_source"], text, None, dict(row["extra_info"]),
                                                  **where))
        finally:
            await rv.close_clients()
        return out

    return asyncio.run(all_())


def grpo(scores: list[float]) -> list[float]:
    """verl's GRPO by hand over the unmasked (non-NaN) scores of one group: (s - mean) / std."""
    valid = [s for s in scores if not math.isnan(s)]
    mean = sum(valid) / len(valid)
    std = math.sqrt(sum((v - mean) ** 2 for v in valid) / (len(valid) - 1))
    return [0.0 if math.isnan(s) else (s - mean) / (std + 1e-6) for s in scores]


@pytest.fixture(scope="module")
def probe(tmp_path_factory, reward_server, smollm2_path) -> dict[str, Any]:
    model = smollm2_path
    tmp = tmp_path_factory.mktemp("verl_probe")
    rows = build_rows(sample_records()[:2], "rubric_generator")
    outputs = [RULES, "not json", OTHER]
    batches: dict[str, list[dict]] = {}
    for name, masked in (("clean", set()), ("masked", {4})):
        infos = scored(reward_server.target, [rows[0]] * 3 + [rows[1]] * 3, outputs * 2, masked=masked)
        batches[name] = [{"uid": f"u{i // 3}", "session": i % 3, "response_len": 3 + i, "info": info}
                         for i, info in enumerate(infos)]
    payload = {"overrides": [f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.rollout.n=3",
                             "data.train_batch_size=2", "trainer.n_gpus_per_node=1",
                             "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                             "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                             "algorithm.adv_estimator=grpo_masked",
                             "reward.custom_reward_function.reward_kwargs.mask_infra_failures=true",
                             "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
                             "ray_kwargs.ray_init.num_cpus=4", "+ray_kwargs.ray_init.include_dashboard=false"],
               "run_dir": str(tmp / "run"), "batches": batches}
    (tmp / "in.json").write_text(json.dumps(payload))
    proc = subprocess.run([sys.executable, str(PROBE), str(tmp / "in.json"), str(tmp / "out.json")],
                          capture_output=True, text=True, timeout=360)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads((tmp / "out.json").read_text())
    out["batches"] = batches
    return out


def test_grpo_masked_is_registered_in_the_task_runner_by_verls_external_modules(probe) -> None:
    seen = probe["seen"]
    assert seen["external_modules"] == "reward_server.integrations.verl"
    assert not seen["our_module_loaded_before_use"] and seen["our_module_loaded_by_verl"]
    assert seen["registered"]
    assert seen["file_logger"].endswith("/run/run_log.jsonl")  # the run log lands in the run dir


@pytest.mark.parametrize("name", ["clean", "masked"])
def test_verls_compute_advantage_gives_hand_computed_grpo(probe, name) -> None:
    batch = probe["batches"][name]
    got = probe["results"][name]["advantages"]
    for uid in ("u0", "u1"):
        trajs = [t for t in batch if t["uid"] == uid]
        want = grpo([t["info"]["score"] for t in trajs])
        for t, w in zip(trajs, want, strict=True):
            adv = got[f"{uid}_{t['session']}_0"]
            assert len(adv) == t["response_len"]  # one advantage per response token
            assert adv == pytest.approx([w] * t["response_len"], abs=1e-5)
    if name == "masked":
        assert got["u1_1_0"] == [0.0] * 7  # the masked sample


@pytest.mark.parametrize("name", ["clean", "masked"])
def test_verls_step_metrics_are_finite_and_carry_the_reward_components(probe, name) -> None:
    result = probe["results"][name]
    metrics = result["metrics"]
    assert result["sampler"] == "RewardReplayBuffer"
    assert [k for k, v in metrics.items() if not math.isfinite(v)] == []
    scores = [t["info"]["score"] for t in probe["batches"][name]]
    valid = [s for s in scores if not math.isnan(s)]
    assert metrics["critic/score/mean"] == pytest.approx(sum(valid) / len(valid), rel=1e-5)
    infos = [t["info"] for t in probe["batches"][name]]
    for key in ("s_target", "gamma", "n_valid", "policy_invalid", "reward_masked"):
        # over the samples the component applies to (its <key>_mask is not 0; no NaN sent)
        vals = [i[key] for i in infos if math.isfinite(i[key]) and i.get(f"{key}_mask") != 0.0]
        assert metrics[f"reward/{key}"] == pytest.approx(sum(vals) / len(vals), rel=1e-6), key
    assert metrics["reward/reward_masked"] == (1 / 6 if name == "masked" else 0.0)
    assert metrics["reward/policy_invalid"] == pytest.approx(2 / 6 if name == "clean" else 1 / 6)


def test_through_verls_own_replay_buffer_a_masked_sample_turns_scores_nan(probe) -> None:
    """Why the sampler is in our presets: verl's v1 re-reads rm_scores for its metrics."""
    result = probe["results"]["verl_sampler"]
    assert result["sampler"] == "ReplayBuffer"
    assert math.isnan(result["metrics"]["critic/score/mean"])
    assert not any(k.startswith("reward/") for k in result["metrics"])
