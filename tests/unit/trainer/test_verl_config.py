"""Our overlays compose with verl's own Hydra config and pass verl's own validation (CPU)."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("verl", reason="verl is the train extra: pip install -e .[train]")

from trainer import verl_runner


@pytest.fixture(scope="module")
def parl_config():  # type: ignore[no-untyped-def]
    return verl_runner.compose("rubric_generator", ["data.train_files=x.parquet"])


def test_paper_hyperparameters_land_in_verls_config(parl_config) -> None:
    c = parl_config
    assert c.algorithm.adv_estimator == "grpo" and c.algorithm.use_kl_in_reward is False
    assert c.data.train_batch_size == 8
    assert (c.data.max_prompt_length, c.data.max_response_length) == (10240, 2048)
    a, r = c.actor_rollout_ref.actor, c.actor_rollout_ref.rollout
    assert (a.optim.lr, a.optim.lr_scheduler_type, a.optim.min_lr_ratio) == (1e-5, "cosine", 0.1)
    assert (a.use_kl_loss, a.kl_loss_coef, a.kl_loss_type) == (True, 0.001, "low_var_kl")
    assert a.clip_ratio == 0.2
    assert (r.n, r.temperature, r.top_p) == (5, 0.6, 0.95)
    assert c.trainer.total_epochs == 4
    assert c.reward.custom_reward_function.path == "trainer/reward_fn.py"
    assert c.reward.custom_reward_function.name == "compute_score"
    assert c.data.train_files == "x.parquet"
    # verl's own defaults are still there underneath
    assert c.actor_rollout_ref.actor.ppo_epochs == 1


def test_overlays_pass_verls_validation(parl_config) -> None:
    verl_runner.validate(parl_config)
    verl_runner.validate(verl_runner.compose("personalized_generator"))


def test_verls_validation_rejects_a_bad_override() -> None:
    # 3 prompts x 5 rollouts = 15 samples cannot be split over 8 GPUs
    bad = verl_runner.compose("rubric_generator", ["data.train_batch_size=3"])
    with pytest.raises((AssertionError, ValueError)):
        verl_runner.validate(bad)


def test_unknown_key_is_refused_by_hydra() -> None:
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        verl_runner.compose("rubric_generator", ["algorithm.no_such_key=1"])


def test_grpo_masked_leaves_masked_samples_out() -> None:
    import numpy as np
    import torch
    from verl.trainer.ppo import core_algos

    import trainer.reward_fn as rf

    rf.register_verl_extensions()
    fn = core_algos.get_adv_estimator_fn(rf.MASKED_ESTIMATOR)
    rewards = torch.zeros((4, 3))
    rewards[:, 2] = torch.tensor([1.0, 3.0, float("nan"), 5.0])
    mask = torch.ones((4, 3))
    adv, _ = fn(token_level_rewards=rewards, response_mask=mask,
                index=np.array(["g", "g", "g", "h"]), epsilon=0.0)
    # group g: valid {1, 3}: mean 2, unbiased std sqrt(2); h: singleton -> mean 0, std 1
    s = math.sqrt(2.0)
    assert adv[:, 0].tolist() == pytest.approx([-1 / s, 1 / s, 0.0, 5.0])
    assert not torch.isnan(rewards).any()  # zeroed in place so verl's metrics stay finite
