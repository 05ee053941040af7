"""Our overlays compose with verl's own Hydra config, carry only keys verl has, name a registered
estimator, and pass verl's own validation (CPU); ``--check-config`` says clearly what is wrong."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl is the train extra: pip install -e .[train]")

from reward_server.errors import ConfigError
from trainer import run, verl_runner


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
    assert r.top_k == 20  # PARL's released configs (recipe/parl/config/*_parl_*.yaml); verl's default is -1
    assert c.trainer.total_epochs == 4
    # our pieces, by package path (one module per verl process, not a file exec'd per worker)
    assert c.reward.custom_reward_function.path == "pkg://reward_server.integrations.verl"
    assert c.reward.custom_reward_function.name == "compute_score"
    assert c.trainer.v1.sampler.custom_sampler.path == "pkg://reward_server.integrations.verl_sampler"
    assert c.trainer.save_freq > 0 and "hf_model" in a.checkpoint.save_contents
    assert c.data.train_files == "x.parquet"
    assert c.actor_rollout_ref.actor.ppo_epochs == 1  # verl's own defaults are still underneath


@pytest.mark.parametrize("preset", verl_runner.PRESETS)
def test_both_presets_pass_our_checks_and_verls_validation(preset) -> None:
    verl_runner.check(verl_runner.compose(preset), preset)
    assert verl_runner.unknown_overlay_keys(preset) == []


def test_verls_validation_rejects_a_bad_override() -> None:
    # 3 prompts x 5 rollouts = 15 samples cannot be split over 8 GPUs; verl checks it only with
    # fixed micro-batches (with the presets' dynamic batch sizes our own check does:
    # tests/unit/trainer/test_verl_checks.py)
    bad = verl_runner.compose("rubric_generator", ["data.train_batch_size=3",
                                                   "actor_rollout_ref.actor.use_dynamic_bsz=false"])
    with pytest.raises((AssertionError, ValueError)):
        verl_runner.validate(bad)


def test_unknown_key_on_the_command_line_is_refused_by_hydra(capsys) -> None:
    rc = run.main(["--engine", "verl", "--check-config", "algorithm.no_such_key=1"])
    assert rc == 2 and "Could not override 'algorithm.no_such_key'" in capsys.readouterr().err


def test_a_misspelt_overlay_key_passes_verl_but_not_our_check(tmp_path) -> None:
    conf = tmp_path / "config"  # our config dir, with a rollout key misspelt in paper_grpo.yaml
    shutil.copytree(verl_runner.CONFIG_DIR, conf)
    text = (conf / "paper_grpo.yaml").read_text()
    assert "    temperature: 0.6" in text
    # the rollout's own (the first; val_kwargs has one too)
    (conf / "paper_grpo.yaml").write_text(text.replace("    temperature: 0.6", "    temprature: 0.6", 1))
    config = verl_runner.compose("rubric_generator", config_dir=conf)
    verl_runner.validate(config)  # verl's own validation does not see it
    assert verl_runner.unknown_overlay_keys("rubric_generator", conf) == [
        "paper_grpo.yaml: actor_rollout_ref.rollout.temprature"]
    with pytest.raises(ConfigError, match="temprature: not a key of verl's ppo_trainer config"):
        verl_runner.check(config, "rubric_generator", conf)


def test_check_config_names_an_unregistered_estimator_and_a_bad_reward_kwarg(capsys) -> None:
    rc = run.main(["--engine", "verl", "--check-config", "algorithm.adv_estimator=grpo_maskd",
                   "+reward.custom_reward_function.reward_kwargs.deadline=3"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "algorithm.adv_estimator='grpo_maskd' is not a registered estimator" in err
    assert "'grpo_masked'" in err  # the choices are listed
    assert "unknown ['deadline']" in err and "'deadline_s'" in err


def test_check_config_refuses_masking_without_the_masked_estimator(capsys) -> None:
    rc = run.main(["--engine", "verl", "--check-config",
                   "reward.custom_reward_function.reward_kwargs.mask_infra_failures=true"])
    assert rc == 2 and "needs algorithm.adv_estimator=grpo_masked" in capsys.readouterr().err
    rc = run.main(["--engine", "verl", "--check-config", "--mask-infra-failures",
                   "--reward-server", "h:1", "--deadline-s", "30"])
    out = capsys.readouterr().out
    assert rc == 0 and "adv_estimator: grpo_masked" in out and "deadline_s: 30.0" in out


def test_grpo_masked_leaves_masked_samples_out() -> None:
    import numpy as np
    import torch
    from verl.trainer.ppo import core_algos

    from reward_server.integrations import verl as rv

    fn = core_algos.get_adv_estimator_fn(rv.MASKED_ESTIMATOR)
    rewards = torch.zeros((5, 3))
    rewards[:, 2] = torch.tensor([1.0, 3.0, float("nan"), 5.0, 7.0])
    mask = torch.ones((5, 3))
    mask[4] = 0.0  # masked as verl_sampler carries it: all-zero response mask
    adv, _ = fn(token_level_rewards=rewards, response_mask=mask,
                index=np.array(["g", "g", "g", "h", "g"]), epsilon=0.0)
    # group g: valid {1, 3}: mean 2, unbiased std sqrt(2); h: singleton -> mean 0, std 1
    s = math.sqrt(2.0)
    assert adv[:, 0].tolist() == pytest.approx([-1 / s, 1 / s, 0.0, 5.0, 0.0])
    assert not torch.isnan(rewards).any()  # zeroed in place


def test_relative_output_dir_inside_a_ray_job_is_refused(tmp_path, monkeypatch) -> None:
    job_dir = tmp_path / "session" / "runtime_resources" / "working_dir_files" / "_ray_pkg_x"
    job_dir.mkdir(parents=True)
    monkeypatch.chdir(job_dir)
    args = run.parser().parse_args(["--engine", "trl", "--output-dir", "runs"])
    with pytest.raises(SystemExit, match="Pass an absolute path"):
        run.run_dir(args, "pg")
    args = run.parser().parse_args(["--engine", "trl", "--output-dir", str(tmp_path / "out"),
                                    "--run-name", "r1"])
    assert run.run_dir(args, "pg") == tmp_path / "out" / "r1"
    with pytest.raises(SystemExit, match="runs never overwrite each other"):
        run.run_dir(args, "pg")
    assert Path(tmp_path / "out" / "r1").is_dir()


def test_the_retry_budget_goes_from_the_cli_into_the_reward_kwargs() -> None:
    from reward_server.client import RetryBudget

    args, extra = run.parser().parse_known_args([
        "--engine", "verl", "--preset", "rubric_generator", "--attempts", "2",
        "--deadline-s", "7", "--backoff-cap-s", "0.5", "data.train_files=x.parquet"])
    config = verl_runner.compose("rubric_generator", run.verl_overrides(args, extra))
    kw = config.reward.custom_reward_function.reward_kwargs
    assert (kw.attempts, kw.deadline_s, kw.backoff_cap_s) == (2, 7.0, 0.5)  # what compute_score gets
    assert verl_runner.retry_budget(config) == RetryBudget(attempts=2, deadline_s=7.0, backoff_cap_s=0.5)


@pytest.mark.parametrize("address", ["10.0.0.1:50051", "10.0.0.1:50051,10.0.0.2:50051"])
def test_several_reward_server_addresses_reach_the_reward_kwargs_as_one_string(address) -> None:
    args = run.parser().parse_args(["--engine", "verl", "--preset", "rubric_generator",
                                  "--reward-server", address])
    config = verl_runner.compose("rubric_generator", run.verl_overrides(args, []))
    # one string, not a Hydra sweep; the client turns it into a round robin target
    assert config.reward.custom_reward_function.reward_kwargs.reward_server == address


def test_check_config_prints_the_runs_absolute_checkpoint_dir_and_makes_nothing(
    tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    assert run.main(["--engine", "verl", "--check-config", "--output-dir", "rel", "--run-name", "r"]) == 0
    assert f"default_local_dir: {tmp_path / 'rel' / 'r' / 'checkpoints'}" in capsys.readouterr().out
    assert not (tmp_path / "rel").exists()
