"""Table 1 arithmetic: the fitted threshold rule, Pos/Neg/Acc, Std and Mean rows."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from reward_server.eval.robustness import accuracy, fit_threshold, read_pairs, table

LABELS = [True, True, False, False]


def test_fit_threshold_midpoint_of_the_best_gap() -> None:
    assert fit_threshold([0.9, 0.8, 0.3, 0.5], LABELS) == pytest.approx(0.65)
    # not separable: 0.4 (pos) < 0.6 (neg); best is 3/4 at the lowest such midpoint
    t = fit_threshold([0.9, 0.4, 0.6, 0.1], LABELS)
    assert accuracy([0.9, 0.4, 0.6, 0.1], LABELS, t) == 0.75 and t == pytest.approx(0.25)


def test_table_by_hand() -> None:
    scores = {
        "nli": {0.0: [0.9, 0.9, 0.1, 0.1], 1.0: [0.9, 0.4, 0.1, 0.6]},
        "bleu": {0.0: [1.0, 1.0, 0.8, 0.7], 1.0: [0.5, 0.6, 0.5, 0.4]},
    }
    t = table(scores, LABELS, thresholds={"bleu": "fit"}, nli_methods=("nli",), nli_tau=0.5)
    assert t["decision"]["bleu"]["threshold"] == pytest.approx(0.9) and t["decision"]["nli"]["threshold"] == 0.5
    r0, r1 = t["rows"]
    assert r0["methods"]["bleu"] == {"pos": 1.0, "neg": 0.75, "acc": 1.0}
    assert r1["methods"]["bleu"]["acc"] == 0.5  # every score now below the fitted 0.9
    assert r1["methods"]["nli"] == {"pos": pytest.approx(0.65), "neg": pytest.approx(0.35), "acc": 0.5}
    assert t["mean"]["bleu"]["acc"] == 0.75 and t["std"]["bleu"]["acc"] == pytest.approx(statistics.pstdev([1, 0.5]))
    fixed = table(scores, LABELS, thresholds={"bleu": 0.55})
    assert fixed["rows"][1]["methods"]["bleu"]["acc"] == 0.75 and fixed["decision"]["bleu"]["rule"] == "fixed, as given"


def test_read_pairs_needs_both_labels(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text('{"response": "a", "reference": "a", "label": "positive"}\n')
    with pytest.raises(ValueError, match="both positive and negative"):
        read_pairs(f)
    f.write_text('{"response": "a", "reference": "a", "label": "maybe"}\n')
    with pytest.raises(ValueError, match=r"p.jsonl:1: label"):
        read_pairs(f)
