"""``--check-config``'s own consistency checks, beyond verl's ``validate_config``: each
inconsistency is refused with a message naming the keys and the fix, on verl's own composed
config (CPU). Where verl's own validation lets it through, the test shows that too."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl is the train extra: pip install -e .[train]")

from reward_server.errors import ConfigError
from trainer import run, verl_checks, verl_runner
from trainer.data.prepare import build_rows, main, sample_records, write_parquet

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
REF = "actor_rollout_ref.ref"


def compose(*overrides: str, preset: str = "rubric_generator") -> object:
    return verl_runner.compose(preset, list(overrides))


def refused(*overrides: str, preset: str = "rubric_generator") -> str:
    """The message of our check that refuses these overrides (exactly one problem)."""
    found = verl_runner.problems(compose(*overrides, preset=preset), preset)
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("preset", verl_runner.PRESETS)
def test_the_presets_budgets_hold_a_whole_sequence(preset: str) -> None:
    c = compose(preset=preset)
    need = c.data.max_prompt_length + c.data.max_response_length
    a, r, ref = c.actor_rollout_ref.actor, c.actor_rollout_ref.rollout, c.actor_rollout_ref.ref
    assert a.use_dynamic_bsz and r.log_prob_use_dynamic_bsz and ref.log_prob_use_dynamic_bsz
    assert min(a.ppo_max_token_len_per_gpu, r.log_prob_max_token_len_per_gpu,
               ref.log_prob_max_token_len_per_gpu) >= 2 * need
    assert r.max_model_len == r.max_num_batched_tokens == need
    assert r.tensor_model_parallel_size == 2
    assert c.trainer.test_freq > 0 and c.trainer.val_before_train
    assert c.trainer.save_freq % c.trainer.test_freq == 0
    assert verl_checks.consistency_problems(c) == []


def test_token_budgets_below_one_sequence_are_refused_each_by_name() -> None:
    for key in (f"{ACTOR}.ppo_max_token_len_per_gpu", f"{ROLLOUT}.log_prob_max_token_len_per_gpu",
                f"{REF}.log_prob_max_token_len_per_gpu"):
        msg = refused(f"{key}=8192")
        assert msg.startswith(f"{key}=8192 (x ulysses 1) < data.max_prompt_length + "
                              "data.max_response_length = 10240 + 2048 = 12288")
        assert f"Set {key}=24576 (two sequences) or at least 12288" in msg
    # sequence parallelism splits a sequence over GPUs: the per-GPU budget may be smaller
    c = compose(f"{ACTOR}.ppo_max_token_len_per_gpu=8192", f"{ROLLOUT}.log_prob_max_token_len_per_gpu=8192",
                f"{REF}.log_prob_max_token_len_per_gpu=8192",
                f"{ACTOR}.fsdp_config.ulysses_sequence_parallel_size=2",
                f"{REF}.fsdp_config.ulysses_sequence_parallel_size=2")
    assert verl_checks.token_budget_problems(c) == []


def test_verls_own_validation_lets_a_too_small_budget_through() -> None:
    c = compose(f"{ACTOR}.ppo_max_token_len_per_gpu=8192")
    verl_runner.validate(c)  # verl finds nothing; its first update would assert
    with pytest.raises(ConfigError, match=r"ppo_max_token_len_per_gpu=8192 \(x ulysses 1\) < "):
        verl_runner.check(c, "rubric_generator")


def test_rollout_lengths_below_prompt_plus_response_are_refused() -> None:
    msg = refused(f"{ROLLOUT}.max_model_len=8192")
    assert msg.startswith(f"{ROLLOUT}.max_model_len=8192 < data.max_prompt_length + "
                          "data.max_response_length = 10240 + 2048 = 12288")
    assert f"Set {ROLLOUT}.max_model_len=12288" in msg
    msg = refused(f"{ROLLOUT}.max_num_batched_tokens=8192")  # verl's default
    assert "a prompt is prefilled only in chunks" in msg
    assert f"Set {ROLLOUT}.max_num_batched_tokens=12288" in msg
    msg = refused(f"{ROLLOUT}.max_num_batched_tokens=8192", f"{ROLLOUT}.enable_chunked_prefill=false")
    assert "verl raises it to max_model_len behind your back" in msg
    # the personalized generator's responses are shorter: its own sum
    msg = refused(f"{ROLLOUT}.max_model_len=11000", preset="personalized_generator")
    assert "10240 + 1024 = 11264" in msg and f"Set {ROLLOUT}.max_model_len=11264" in msg
    # a longer response on the command line needs the rollout lengths to follow
    msgs = verl_runner.problems(compose("data.max_response_length=4096"), "rubric_generator")
    assert [m.split("=")[0] for m in msgs] == [f"{ROLLOUT}.max_model_len",
                                               f"{ROLLOUT}.max_num_batched_tokens"]


def test_samples_that_do_not_split_over_the_gpus_are_refused_where_verl_is_silent() -> None:
    # 3 prompts x 5 rollouts = 15 samples over 8 GPUs; with dynamic batch sizes verl's own
    # validate_config skips its divisibility check
    c = compose("data.train_batch_size=3", f"{ACTOR}.ppo_mini_batch_size=3")
    verl_runner.validate(c)
    msg, mini = verl_runner.problems(c, "rubric_generator")
    assert mini.startswith(f"{ACTOR}.ppo_mini_batch_size x {ROLLOUT}.n = 3 x 5 = 15 samples")
    assert msg.startswith(f"data.train_batch_size x {ROLLOUT}.n = 3 x 5 = 15 samples do not split "
                          "evenly over 8 data-parallel ranks (trainer.n_gpus_per_node x "
                          "trainer.nnodes = 8 x 1 = 8 GPUs, ulysses 1)")
    assert "Make data.train_batch_size a multiple of 8" in msg
    # 6 GPUs: 8 x 5 = 40 samples do not split over 6 ranks; TP 2 still fits 3 replicas
    msgs = verl_runner.problems(compose("trainer.n_gpus_per_node=6"), "rubric_generator")
    assert len(msgs) == 2 and "over 6 data-parallel ranks" in msgs[0]
    assert "Make data.train_batch_size a multiple of 6" in msgs[0]
    assert msgs[1].startswith(f"{ACTOR}.ppo_mini_batch_size x {ROLLOUT}.n = 8 x 5 = 40")


def test_a_mini_batch_that_does_not_divide_the_step_is_refused() -> None:
    msg = refused("data.train_batch_size=8", f"{ACTOR}.ppo_mini_batch_size=16")
    assert msg.startswith(f"data.train_batch_size=8 is not a multiple of {ACTOR}.ppo_mini_batch_size=16")
    assert f"e.g. {ACTOR}.ppo_mini_batch_size=8" in msg


def test_fixed_micro_batches_must_divide_each_gpus_share() -> None:
    # without dynamic batch sizes: 8 x 5 / 8 GPUs = 5 samples per GPU, micro-batches of 2
    msg = refused(f"{ACTOR}.use_dynamic_bsz=false")
    assert msg.startswith(f"{ACTOR}.ppo_micro_batch_size_per_gpu=2 does not divide the 5 samples "
                          "each GPU gets per mini-batch (8 x 5 / 8)")
    assert verl_runner.problems(compose(f"{ACTOR}.use_dynamic_bsz=false",
                                        f"{ACTOR}.ppo_micro_batch_size_per_gpu=1"),
                                "rubric_generator") == []


def test_a_rollout_replica_that_does_not_divide_the_gpus_is_refused() -> None:
    msg = refused(f"{ROLLOUT}.tensor_model_parallel_size=3")
    assert msg.startswith("trainer.n_gpus_per_node x trainer.nnodes = 8 x 1 = 8 GPUs are not a "
                          "multiple of one vLLM replica's 3 GPUs")
    assert f"Set {ROLLOUT}.tensor_model_parallel_size to a divisor of 8" in msg


def test_one_gpu_shrink_passes() -> None:
    """The docs' one-GPU recipe: one GPU, TP 1 (data arithmetic unchanged)."""
    c = compose("trainer.n_gpus_per_node=1", f"{ROLLOUT}.tensor_model_parallel_size=1",
                "actor_rollout_ref.model.path=Qwen/Qwen3-1.7B")
    assert verl_runner.problems(c, "rubric_generator") == []
    verl_runner.validate(c)


def test_an_unknown_logger_is_refused() -> None:
    msg = refused("trainer.logger=[console,tensorbord]")
    assert msg.startswith("trainer.logger=['console', 'tensorbord']: ['tensorbord'] not verl loggers")
    assert "'tensorboard'" in msg


def test_validation_without_val_files_is_refused() -> None:
    msg = refused("data.val_files=null")
    assert msg.startswith("data.val_files is not set but validation is on (trainer.test_freq=25, "
                          "trainer.val_before_train=True)")
    assert "trainer.test_freq=-1 trainer.val_before_train=false" in msg
    assert verl_runner.problems(compose("data.val_files=null", "trainer.test_freq=-1",
                                        "trainer.val_before_train=false"), "rubric_generator") == []


def test_val_files_naming_the_training_file_are_refused() -> None:
    msg = refused("data.train_files=d/train.parquet", "data.val_files=d/train.parquet")
    assert msg.startswith("data.val_files and data.train_files both name ['d/train.parquet']")


def test_val_rows_copied_from_training_are_refused(tmp_path: Path) -> None:
    rows = build_rows(sample_records(), "rubric_generator")
    write_parquet(rows, tmp_path / "train.parquet")
    write_parquet(rows[:2], tmp_path / "val.parquet")  # what `prepare --sample` used to write
    msg = refused(f"data.train_files={tmp_path / 'train.parquet'}",
                  f"data.val_files={tmp_path / 'val.parquet'}")
    assert msg.startswith("data.val_files: 2 of 2 rows repeat a row of data.train_files (same 'prompt')")
    assert "--val-size N" in msg


def test_prepares_held_out_split_passes(tmp_path: Path) -> None:
    assert main(["--sample", "--task", "rubric_generator", "--out", str(tmp_path)]) == 0
    assert verl_runner.problems(compose(f"data.train_files={tmp_path / 'train.parquet'}",
                                        f"data.val_files={tmp_path / 'val.parquet'}"),
                                "rubric_generator") == []


def test_check_config_prints_every_problem_and_exits_2(capsys) -> None:
    rc = run.main(["--engine", "verl", "--check-config", f"{ACTOR}.ppo_max_token_len_per_gpu=4096",
                   f"{ROLLOUT}.tensor_model_parallel_size=3"])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"{ACTOR}.ppo_max_token_len_per_gpu=4096" in err and "replica's 3 GPUs" in err


@pytest.mark.parametrize(("report_to", "loggers"), [
    ("none", ["console"]),
    ("tensorboard", ["console", "tensorboard"]),
    ("tensorboard,wandb", ["console", "tensorboard", "wandb"]),
])
def test_trainer_logger_follows_report_to(report_to: str, loggers: list[str]) -> None:
    args, extra = run.parser().parse_known_args(["--engine", "verl", "--report-to", report_to])
    c = verl_runner.compose("rubric_generator", run.verl_overrides(args, extra))
    assert list(c.trainer.logger) == loggers
    assert verl_checks.logger_problems(c) == []
