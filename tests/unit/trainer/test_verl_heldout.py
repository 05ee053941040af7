"""The verl presets' validation is the held-out evaluation of bench/learning.py: the held-out
users sampled as in training, several completions per prompt, written where trainer.heldout
reads them, with the same statistics (verl's own classes and functions, on CPU)."""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl is the train extra: pip install -e .[train]")

from trainer import verl_runner
from trainer.heldout import stratified_mean_se, summarize


@pytest.mark.parametrize("preset", verl_runner.PRESETS)
def test_validation_samples_as_training_does_several_times_a_prompt(preset: str) -> None:
    r = verl_runner.compose(preset).actor_rollout_ref.rollout
    v = r.val_kwargs
    assert v.do_sample is True and v.n >= 2  # a standard error needs two completions a prompt
    assert (v.temperature, v.top_p, v.top_k) == (r.temperature, r.top_p, r.top_k)
    # the bench's TRL defaults are the same sampling
    from bench.learning import parser

    bench = parser().parse_args([])
    assert (bench.temperature, bench.top_k) == (v.temperature, v.top_k)


def test_a_run_writes_its_validations_under_heldout(tmp_path: Path) -> None:
    config = verl_runner.compose("personalized_generator")
    verl_runner.configure_run(config, tmp_path / "run")
    assert config.trainer.validation_data_dir == str(tmp_path / "run" / "heldout")
    mine = verl_runner.compose("personalized_generator", [f"trainer.validation_data_dir={tmp_path / 'mine'}"])
    verl_runner.configure_run(mine, tmp_path / "run")
    assert mine.trainer.validation_data_dir == str(tmp_path / "mine")  # the user's own stays


def test_verls_own_dump_gives_the_benchs_statistics(tmp_path: Path) -> None:
    from verl.trainer.ppo.metric_utils import process_validation_metrics
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    rng = random.Random(0)
    n = 8
    prompts = [("amazon", "u-a"), ("news", "u-b"), ("reddit", "u-c")]  # one held-out user per source
    keys, inputs, scores, sources, uids = [], [], [], [], []
    for source, uid in prompts:
        for i in range(n):
            keys.append(f"{uid}_{i}_0")  # verl's {uid}_{session}_{output} keys
            inputs.append(f"the prompt of {uid}")
            scores.append(rng.uniform(0.4, 0.8))
            sources.append(source)
            uids.append(uid)
    PPOTrainer._write_generations(inputs, ["text"] * len(keys), [None] * len(keys), scores,
                                  {"uid": keys}, str(tmp_path), 25)
    (step, held), = summarize(tmp_path).items()
    assert step == 25 and held.prompts == 3 and held.samples == 3 * n
    groups = {uid: [s for s, u in zip(scores, uids, strict=True) if u == uid] for _, uid in prompts}
    assert (held.mean, held.se) == pytest.approx(stratified_mean_se(groups))
    # verl's own val-core/<source>/reward/mean@8, averaged over the sources (one prompt each)
    metrics = process_validation_metrics(sources, uids, {"reward": scores})
    assert held.mean == pytest.approx(statistics.mean(m["reward"][f"mean@{n}"] for m in metrics.values()))
