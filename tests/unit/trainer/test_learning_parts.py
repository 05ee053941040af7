"""The pieces of "does it learn?" that need no model: the held-out standard error, the control
arms' reward transforms, the step clock's sections and the lines the trainer prints."""

from __future__ import annotations

import math
import statistics
import time

import pytest

torch = pytest.importorskip("torch")

from trainer.heldout import read_dump, stratified_mean_se, summarize  # noqa: E402
from trainer.reward_transforms import transform_rewards  # noqa: E402
from trainer.trl_profile import SECTIONS, StepClock, profile_line  # noqa: E402


def test_stratified_se_is_the_error_of_the_mean_of_prompt_means() -> None:
    groups = {"a": [0.1, 0.3, 0.2, 0.6], "b": [0.9, 0.7], "c": [0.5, 0.5, 0.5]}
    mean, se = stratified_mean_se(groups)
    assert mean == pytest.approx((0.3 + 0.8 + 0.5) / 3)
    var_a = statistics.variance(groups["a"]) / 4
    var_b = statistics.variance(groups["b"]) / 2
    assert se == pytest.approx(math.sqrt(var_a + var_b + 0.0) / 3)


def test_stratified_se_refuses_a_prompt_with_one_sample() -> None:
    with pytest.raises(ValueError, match="group 'b' has 1 finite values"):
        stratified_mean_se({"a": [0.1, 0.2], "b": [0.3, float("nan")]})
    with pytest.raises(ValueError, match="no groups"):
        stratified_mean_se({})


def test_negate_flips_every_sign() -> None:
    r = torch.tensor([[0.2], [0.5], [float("nan")]])
    out = transform_rewards(r, "negate", seed=0)
    assert out[:2].flatten().tolist() == pytest.approx([-0.2, -0.5])
    assert math.isnan(out[2, 0])


def test_shuffle_permutes_the_finite_rows_and_keeps_masked_ones_masked() -> None:
    values = [float(i) for i in range(16)]
    r = torch.tensor([[v] for v in values] + [[float("nan")]])
    outs = [transform_rewards(r, "shuffle", seed=s) for s in range(5)]
    for out in outs:
        assert sorted(out[:16].flatten().tolist()) == values  # the same values ...
        assert math.isnan(out[16, 0])  # ... and the masked row stays where it was
    assert any(out[:16].flatten().tolist() != values for out in outs)  # ... moved
    assert torch.equal(transform_rewards(r, "shuffle", seed=3)[:16], outs[3][:16])  # seed alone decides
    assert transform_rewards(r, "none", seed=0) is r
    with pytest.raises(ValueError, match="choose one of"):
        transform_rewards(r, "reverse", seed=0)


def test_step_clock_splits_a_step_into_sections_that_add_up() -> None:
    clock = StepClock()
    clock.begin()
    with clock.timed("training_step"):
        with clock.timed("prepare"):
            with clock.timed("generate"):
                time.sleep(0.03)
            with clock.timed("ref_forward"):
                time.sleep(0.02)
        with clock.timed("compute_loss"):
            with clock.timed("policy_forward"):
                time.sleep(0.02)
        time.sleep(0.01)  # backward
    time.sleep(0.01)  # outside every section
    row = clock.close()
    assert set(row) == set(SECTIONS) | {"step"}
    assert row["generate"] >= 0.03 and row["ref_forward"] >= 0.02 and row["policy_forward"] >= 0.02
    assert row["backward"] >= 0.01 and row["other"] >= 0.01
    assert sum(v for k, v in row.items() if k != "step") == pytest.approx(row["step"])
    assert clock.close() == {}  # one row per step


def test_profile_line_names_the_big_sections_with_their_share() -> None:
    logs = {"time/step": 10.0, "time/generate": 6.0, "time/ref_forward": 2.5, "time/backward": 1.45,
            "time/log": 0.05, "reward": 0.5}
    line = profile_line(7, logs)
    assert line == "step 7 time 10.00s: generate 6.00 (60%), ref_forward 2.50 (25%), backward 1.45 (14%)"
    assert profile_line(7, {"reward": 0.5}) is None


def test_summarize_reads_both_engines_dumps(tmp_path) -> None:  # type: ignore[no-untyped-def]
    trl = tmp_path / "trl"
    trl.mkdir()
    rows = [{"user_id": u, "index": 0, "completion": "x", "reward": r}
            for u, rs in (("a", [0.1, 0.3]), ("b", [0.6, 0.8])) for r in rs]
    (trl / "step-0.jsonl").write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    verl = tmp_path / "verl"
    verl.mkdir()
    vrows = [{"input": p, "output": "x", "gts": None, "score": r, "step": 0, "uid": f"{u}_{i}_0"}
             for p, u, rs in (("pa", "u1", [0.1, 0.3]), ("pb", "u2", [0.6, 0.8])) for i, r in enumerate(rs)]
    (verl / "0.jsonl").write_text("".join(__import__("json").dumps(r) + "\n" for r in vrows))
    for folder in (trl, verl):
        (step, stats), = summarize(folder).items()
        assert step == 0
        assert stats.mean == pytest.approx(0.45)
        assert stats.prompts == 2 and stats.samples == 4
        assert stats.se == pytest.approx(math.sqrt(0.02 / 2 + 0.02 / 2) / 2)
    assert len(read_dump(verl / "0.jsonl")) == 2
