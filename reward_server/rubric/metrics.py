"""Evaluation metrics of docs/parl.md §5 as pure functions.

A *sample* is one test response of one user, represented by the p_yes of each of its user's
validated rules on that response (``Sequence[float]``; empty when the user has no rule).
A rule is satisfied iff p_yes > threshold, or p_yes >= threshold with ``inclusive``
(``rubric.threshold_rule``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def satisfied(p: Sequence[float], threshold: float, *, inclusive: bool = False) -> list[bool]:
    return [x >= threshold if inclusive else x > threshold for x in p]


def user_level_accuracy(
    samples: Sequence[Sequence[float]], threshold: float = 0.5, *, inclusive: bool = False
) -> float:
    """All-or-nothing: share of samples whose EVERY rule has p_yes > threshold, over the samples
    whose user has at least one rule (NaN when there is none)."""
    scored = [all(satisfied(s, threshold, inclusive=inclusive)) for s in samples if len(s) > 0]
    return sum(scored) / len(scored) if scored else math.nan


def per_sample_user_level(
    samples: Sequence[Sequence[float]], threshold: float = 0.5, *, inclusive: bool = False
) -> list[float]:
    """1.0/0.0 per sample with rules (the paired vector behind the t-test)."""
    return [1.0 if all(satisfied(s, threshold, inclusive=inclusive)) else 0.0 for s in samples if len(s) > 0]


@dataclass(frozen=True)
class RubricLevelAccuracy:
    pooled: float  # satisfied (sample, rule) pairs / all pairs
    per_sample_mean: float  # mean over samples of their satisfied fraction


def rubric_level_accuracy(
    samples: Sequence[Sequence[float]], threshold: float = 0.5, *, inclusive: bool = False
) -> RubricLevelAccuracy:
    """Fraction of satisfied (sample, rule) pairs, pooled and per-sample mean (no-rule samples
    excluded; NaN when none is left)."""
    scored = [satisfied(s, threshold, inclusive=inclusive) for s in samples if len(s) > 0]
    if not scored:
        return RubricLevelAccuracy(math.nan, math.nan)
    pairs = sum(len(s) for s in scored)
    pooled = sum(sum(s) for s in scored) / pairs
    per_sample = sum(sum(s) / len(s) for s in scored) / len(scored)
    return RubricLevelAccuracy(pooled, per_sample)


def user_coverage(rule_sets: Mapping[str, Sequence[str]]) -> float:
    """Percentage of users with a non-empty validated rule set (NaN without users)."""
    if not rule_sets:
        return math.nan
    return 100.0 * sum(1 for r in rule_sets.values() if r) / len(rule_sets)


def average_valid_rules(rule_sets: Mapping[str, Sequence[str]]) -> float:
    """Mean number of validated rules per user, uncovered users counted as 0 (Table 4)."""
    if not rule_sets:
        return math.nan
    return sum(len(r) for r in rule_sets.values()) / len(rule_sets)


def max_diff(gt_accuracy: float, method_accuracy: Mapping[str, float]) -> tuple[float, str]:
    """GT user-level accuracy minus the best non-GT method's; returns (diff, best method)."""
    if not method_accuracy:
        raise ValueError("Max-Diff needs at least one non-GT method")
    best = max(method_accuracy, key=lambda m: (method_accuracy[m], m))
    return gt_accuracy - method_accuracy[best], best


def paired_t_test_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided paired t-test p-value of mean(a - b) != 0 (scipy.stats.ttest_rel).

    With zero variance of the differences the test is degenerate: 1.0 when all differences are
    0, else 0.0 (a constant non-zero difference).
    """
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} vs {len(b)}")
    if len(a) < 2:
        return math.nan
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    if max(diffs) == min(diffs):
        return 1.0 if diffs[0] == 0 else 0.0
    from scipy import stats

    return float(stats.ttest_rel(a, b).pvalue)


def llm_judge_normalized(scores: Sequence[float]) -> float:
    """Mean holistic 1-5 judge score normalized to [0, 1] by (s - 1) / 4."""
    if not scores:
        return math.nan
    for s in scores:
        if not 1.0 <= s <= 5.0:
            raise ValueError(f"LLM-as-judge scores are on 1..5, got {s}")
    return sum((s - 1.0) / 4.0 for s in scores) / len(scores)
