"""Evaluation metrics in the shape of NLICV Tables 2/3 (docs/nlicv.md §2); ``eval nli`` renders them.

For each *gold* regime r (items labelled r): mean S_c, mean S_a, mean (S_c + S_a)/2 and the
detection accuracy (share of those items whose predicted regime is r). Mean Acc is the plain
mean of the per-regime accuracies over the regimes that have labelled items (all four in a
complete benchmark). The confusion matrix counts gold (rows) x predicted (columns) in
``REGIME_ORDER``. Items without a gold label count in ``predicted`` only.

A result may be None: an evaluator that gave no usable answer (an LLM judge whose answer did not
parse). It counts in its gold regime's ``n`` as a wrong detection, in ``unanswered`` (per gold
row) instead of a confusion cell, and not in the score means.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reward_server.domain import Regime, Verification
from reward_server.nli.verifier import REGIME_ORDER


@dataclass(frozen=True)
class RegimeStats:
    regime: Regime
    n: int
    mean_s_correct: float  # over answered items (NaN when none is)
    mean_s_aligned: float
    mean_score: float  # mean of (S_c + S_a) / 2
    accuracy: float  # unanswered items count as wrong
    unanswered: int = 0


@dataclass(frozen=True)
class EvalSummary:
    n_items: int
    n_labelled: int
    per_regime: tuple[RegimeStats, ...]  # regimes with labelled items, in REGIME_ORDER
    mean_acc: float | None
    confusion: tuple[tuple[int, ...], ...]  # gold x predicted, REGIME_ORDER
    predicted: Mapping[str, int]
    truncated: int
    seconds: float
    items_per_s: float
    unanswered: int = 0  # results that were None, labelled or not

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_items": self.n_items,
            "n_labelled": self.n_labelled,
            "per_regime": [
                {
                    "regime": s.regime.value,
                    "n": s.n,
                    "mean_s_correct": s.mean_s_correct,
                    "mean_s_aligned": s.mean_s_aligned,
                    "mean_score": s.mean_score,
                    "accuracy": s.accuracy,
                    "unanswered": s.unanswered,
                }
                for s in self.per_regime
            ],
            "mean_acc": self.mean_acc,
            "confusion": {
                "order": [r.value for r in REGIME_ORDER],
                "gold_x_predicted": [list(row) for row in self.confusion],
            },
            "predicted": dict(self.predicted),
            "unanswered": self.unanswered,
            "truncated": self.truncated,
            "seconds": self.seconds,
            "items_per_s": self.items_per_s,
        }


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def summarize(
    gold: Sequence[Regime | None], results: Sequence[Verification | None], *, seconds: float
) -> EvalSummary:
    """Per-regime means and detection accuracy, Mean Acc, confusion matrix, throughput."""
    if len(gold) != len(results):
        raise ValueError(f"{len(gold)} gold labels for {len(results)} results")
    index = {r: i for i, r in enumerate(REGIME_ORDER)}
    confusion = [[0] * len(REGIME_ORDER) for _ in REGIME_ORDER]
    per: list[RegimeStats] = []
    for r in REGIME_ORDER:
        labelled = [v for g, v in zip(gold, results, strict=True) if g is r]
        mine = [v for v in labelled if v is not None]
        for v in mine:
            confusion[index[r]][index[v.regime]] += 1
        if labelled:
            per.append(
                RegimeStats(
                    regime=r,
                    n=len(labelled),
                    mean_s_correct=_mean([v.s_correct for v in mine]),
                    mean_s_aligned=_mean([v.s_aligned for v in mine]),
                    mean_score=_mean([(v.s_correct + v.s_aligned) / 2 for v in mine]),
                    accuracy=sum(1 for v in mine if v.regime is r) / len(labelled),
                    unanswered=len(labelled) - len(mine),
                )
            )
    answered = [v for v in results if v is not None]
    predicted = {r.value: sum(1 for v in answered if v.regime is r) for r in REGIME_ORDER}
    return EvalSummary(
        n_items=len(results),
        n_labelled=sum(1 for g in gold if g is not None),
        per_regime=tuple(per),
        mean_acc=_mean([s.accuracy for s in per]) if per else None,
        confusion=tuple(tuple(row) for row in confusion),
        predicted=predicted,
        truncated=sum(1 for v in answered if v.truncated),
        seconds=seconds,
        items_per_s=len(results) / seconds if seconds > 0 else float("inf"),
        unanswered=len(results) - len(answered),
    )
