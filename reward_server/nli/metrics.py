"""Evaluation metrics in the shape of NLICV Tables 2/3 (docs/nlicv.md §2).

For each *gold* regime r (items labelled r): mean S_c, mean S_a, mean (S_c + S_a)/2 and the
detection accuracy (share of those items whose predicted regime is r). Mean Acc is the plain
mean of the per-regime accuracies over the regimes that have labelled items (all four in a
complete benchmark). The confusion matrix counts gold (rows) x predicted (columns) in
``REGIME_ORDER``. Items without a gold label count in ``predicted`` only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reward_server.domain import Regime, Verification
from reward_server.nli.verifier import REGIME_ORDER


@dataclass(frozen=True)
class RegimeStats:
    regime: Regime
    n: int
    mean_s_correct: float
    mean_s_aligned: float
    mean_score: float  # mean of (S_c + S_a) / 2
    accuracy: float


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
                }
                for s in self.per_regime
            ],
            "mean_acc": self.mean_acc,
            "confusion": {
                "order": [r.value for r in REGIME_ORDER],
                "gold_x_predicted": [list(row) for row in self.confusion],
            },
            "predicted": dict(self.predicted),
            "truncated": self.truncated,
            "seconds": self.seconds,
            "items_per_s": self.items_per_s,
        }


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def summarize(gold: Sequence[Regime | None], results: Sequence[Verification], *, seconds: float) -> EvalSummary:
    """Per-regime means and detection accuracy, Mean Acc, confusion matrix, throughput."""
    if len(gold) != len(results):
        raise ValueError(f"{len(gold)} gold labels for {len(results)} results")
    index = {r: i for i, r in enumerate(REGIME_ORDER)}
    confusion = [[0] * len(REGIME_ORDER) for _ in REGIME_ORDER]
    per: list[RegimeStats] = []
    for r in REGIME_ORDER:
        mine = [v for g, v in zip(gold, results, strict=True) if g is r]
        for v in mine:
            confusion[index[r]][index[v.regime]] += 1
        if mine:
            per.append(
                RegimeStats(
                    regime=r,
                    n=len(mine),
                    mean_s_correct=_mean([v.s_correct for v in mine]),
                    mean_s_aligned=_mean([v.s_aligned for v in mine]),
                    mean_score=_mean([(v.s_correct + v.s_aligned) / 2 for v in mine]),
                    accuracy=_mean([float(v.regime is r) for v in mine]),
                )
            )
    predicted = {r.value: sum(1 for v in results if v.regime is r) for r in REGIME_ORDER}
    return EvalSummary(
        n_items=len(results),
        n_labelled=sum(1 for g in gold if g is not None),
        per_regime=tuple(per),
        mean_acc=_mean([s.accuracy for s in per]) if per else None,
        confusion=tuple(tuple(row) for row in confusion),
        predicted=predicted,
        truncated=sum(1 for v in results if v.truncated),
        seconds=seconds,
        items_per_s=len(results) / seconds if seconds > 0 else float("inf"),
    )


def format_table(summary: EvalSummary) -> str:
    """A plain-text table in the shape of NLICV Table 3."""
    lines = [f"{'regime':16s} {'n':>5s} {'S_c':>6s} {'S_a':>6s} {'(S_c+S_a)/2':>12s} {'acc %':>7s}"]
    for s in summary.per_regime:
        lines.append(
            f"{s.regime.value:16s} {s.n:5d} {s.mean_s_correct:6.3f} {s.mean_s_aligned:6.3f} "
            f"{s.mean_score:12.3f} {100 * s.accuracy:7.2f}"
        )
    acc = "n/a (no gold labels)" if summary.mean_acc is None else f"{100 * summary.mean_acc:.2f}%"
    lines.append(f"Mean Acc: {acc}")
    lines.append("predicted: " + ", ".join(f"{k}={v}" for k, v in summary.predicted.items()))
    lines.append(
        f"{summary.n_items} items in {summary.seconds:.2f} s ({summary.items_per_s:.1f} items/s), "
        f"{summary.truncated} truncated"
    )
    return "\n".join(lines)
