"""Metrics of docs/parl.md §5 on a tiny hand-computed table."""

from __future__ import annotations

import math

import pytest

from reward_server.rubric import metrics as m

# Four samples; the third user has no rule (excluded everywhere).
GT = [[0.9, 0.8], [0.7, 0.4, 0.6], [], [0.51]]
METHOD = [[0.9, 0.2], [0.3, 0.4, 0.2], [], [0.5]]


def test_user_level_accuracy_excludes_users_without_rules() -> None:
    assert m.user_level_accuracy(GT) == pytest.approx(2 / 3)  # samples 1 and 4 all satisfied
    assert m.user_level_accuracy(METHOD) == 0.0  # 0.5 is not > 0.5
    assert math.isnan(m.user_level_accuracy([[], []]))
    assert m.per_sample_user_level(GT) == [1.0, 0.0, 1.0]


def test_rubric_level_accuracy_pooled_and_per_sample() -> None:
    acc = m.rubric_level_accuracy(GT)
    assert acc.pooled == pytest.approx(5 / 6)  # 2 + 2 + 1 satisfied of 6 pairs
    assert acc.per_sample_mean == pytest.approx((1 + 2 / 3 + 1) / 3)
    acc = m.rubric_level_accuracy(METHOD)
    assert acc.pooled == pytest.approx(1 / 6)
    assert acc.per_sample_mean == pytest.approx((0.5 + 0 + 0) / 3)


def test_coverage_and_average_rules() -> None:
    rules = {"u1": ["a", "b"], "u2": ["c", "d", "e"], "u3": [], "u4": ["f"]}
    assert m.user_coverage(rules) == pytest.approx(75.0)
    assert m.average_valid_rules(rules) == pytest.approx(6 / 4)


def test_max_diff_picks_best_non_gt() -> None:
    diff, best = m.max_diff(0.8, {"rag": 0.5, "sft": 0.65, "non": 0.3})
    assert best == "sft" and diff == pytest.approx(0.15)
    with pytest.raises(ValueError):
        m.max_diff(0.8, {})


def test_paired_t_test() -> None:
    a = [1.0, 1.0, 0.0, 1.0]
    b = [0.0, 1.0, 0.0, 0.0]
    # diffs 1, 0, 0, 1: mean 0.5, sd = sqrt(1/3), t = 0.5 / (sqrt(1/3)/2) = sqrt(3); df = 3
    from scipy import stats

    assert m.paired_t_test_p(a, b) == pytest.approx(2 * stats.t.sf(math.sqrt(3), 3))
    assert m.paired_t_test_p(a, a) == 1.0
    assert m.paired_t_test_p([1.0, 1.0], [0.0, 0.0]) == 0.0
    with pytest.raises(ValueError):
        m.paired_t_test_p([1.0], [1.0, 2.0])


def test_llm_judge_normalized() -> None:
    assert m.llm_judge_normalized([1, 5, 3, 4]) == pytest.approx((0 + 1 + 0.5 + 0.75) / 4)
    with pytest.raises(ValueError):
        m.llm_judge_normalized([0])


def test_inclusive_threshold_counts_a_tie() -> None:
    samples = [[0.5, 0.9], [0.6]]
    assert m.user_level_accuracy(samples, 0.5) == 0.5
    assert m.user_level_accuracy(samples, 0.5, inclusive=True) == 1.0
    assert m.rubric_level_accuracy(samples, 0.5).pooled == pytest.approx(2 / 3)
    assert m.rubric_level_accuracy(samples, 0.5, inclusive=True).pooled == 1.0
    assert m.per_sample_user_level(samples, 0.5, inclusive=True) == [1.0, 1.0]
