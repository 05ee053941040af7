"""Classic metrics on hand-computed small cases (the libraries, on the local MiniLM)."""

from __future__ import annotations

import math

import pytest

from reward_server.eval.classic import METEOR_MISSING, ClassicMetrics, ClassicSettings, wordnet_available


@pytest.fixture(scope="module")
def classic() -> ClassicMetrics:
    return ClassicMetrics(ClassicSettings(device="cpu"))


def test_rouge_by_hand(classic: ClassicMetrics) -> None:
    # one overlap-free word of three on each side: P = R = F = 2/3
    assert classic.score("rouge1", ["the cat sat"], ["the cat ran"]) == [pytest.approx(2 / 3)]
    # LCS "one three four" = 3: P = 3/3, R = 3/4, F = 2PR/(P+R) = 6/7
    assert classic.score("rougeL", ["one three four"], ["one two three four"]) == [pytest.approx(6 / 7)]
    assert classic.score("rouge1", ["Dogs bark"], ["cats meow"]) == [0.0]


def test_bleu_by_hand(classic: ClassicMetrics) -> None:
    # precisions 4/5, 3/4, 2/3, 1/2, equal lengths (BP = 1): (4/5 * 3/4 * 2/3 * 1/2) ** (1/4)
    assert classic.score("bleu", ["a b c d e"], ["a b c d f"]) == [pytest.approx(0.2**0.25, abs=1e-4)]
    assert classic.score("bleu", ["the cat sat on the mat"], ["the cat sat on the mat"]) == [pytest.approx(1.0)]


def test_neural_metrics_identical_texts_score_one(classic: ClassicMetrics) -> None:
    hyps = ["The capital of France is Paris.", "I love hiking in the mountains."]
    refs = ["The capital of France is Paris.", "Quarterly revenue fell by four percent."]
    for name in ("embedding", "bertscore"):
        same, other = classic.score(name, hyps, refs)
        assert same == pytest.approx(1.0, abs=1e-4), name
        assert other < 0.9, name
    assert classic.engine("embedding") == "sentence-transformers:minilm-local"


def test_meteor_or_why_not(classic: ClassicMetrics) -> None:
    if wordnet_available():  # exact matches, one chunk of 3: Fmean 1 - 0.5 * (1/3)**3
        assert classic.score("meteor", ["a b c"], ["a b c"]) == [pytest.approx(1 - 0.5 / 27, abs=1e-4)]
    else:
        assert "meteor" not in classic.names and classic.missing["meteor"] == METEOR_MISSING
        assert classic.describe()["missing"] == {"meteor": METEOR_MISSING}


def test_unknown_metric_and_length_mismatch() -> None:
    with pytest.raises(ValueError, match="unknown classic metrics"):
        ClassicMetrics(ClassicSettings(metrics=("rouge3",)))
    m = ClassicMetrics(ClassicSettings(metrics=("bleu",)))
    assert m.names == ("bleu",)
    with pytest.raises(ValueError, match="2 hypotheses for 1 references"):
        m.score("bleu", ["a", "b"], ["a"])
    assert not math.isnan(m.score("bleu", ["a"], ["b"])[0])
