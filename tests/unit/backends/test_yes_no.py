"""The yes/no fold every LLM judge engine shares, and the numerics under it."""

from __future__ import annotations

import math

import pytest

from reward_server.backends.yes_no import (
    answer_spellings,
    answer_token_ids,
    answer_vocab,
    fold_by_ids,
    p_yes,
    p_yes_bounds,
    p_yes_exact,
    side_of,
    variants,
    yes_no_ids,
)
from reward_server.errors import ModelLoadError
from reward_server.numerics import logsumexp, sigmoid


def test_fold_by_ids_and_p() -> None:
    lps = {10: math.log(0.3), 11: math.log(0.1), 20: math.log(0.2), 99: math.log(0.4)}
    l_yes, l_no = fold_by_ids(lps, [10, 11, 12]), fold_by_ids(lps, [20, 21])
    assert l_yes == pytest.approx(math.log(0.4)) and l_no == pytest.approx(math.log(0.2))
    assert l_yes is not None and l_no is not None
    assert p_yes(l_yes, l_no) == pytest.approx(0.4 / 0.6)
    assert fold_by_ids(lps, [5]) is None
    assert p_yes(-1000.0, 0.0) == pytest.approx(0.0) and p_yes(0.0, -1000.0) == 1.0


def test_numerics_extremes() -> None:
    assert sigmoid(800.0) == 1.0 and sigmoid(-800.0) == 0.0 and sigmoid(0.0) == 0.5
    assert logsumexp([1000.0, 1000.0]) == pytest.approx(1000.0 + math.log(2))
    assert logsumexp([-math.inf, 0.0]) == 0.0
    with pytest.raises(ValueError):
        logsumexp([])


class _Tok:
    """A tokenizer whose vocabulary is a dict of whole strings (real protocol: encode)."""

    def __init__(self, vocab: dict[str, list[int]]) -> None:
        self.vocab = vocab

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.vocab.get(text, [0, 0])


def test_answer_token_ids_take_single_token_variants_only() -> None:
    tok = _Tok({"yes": [1], "Yes": [2], " yes": [3], " Yes": [1], "no": [5]})
    assert variants("yes", "pooled-v1") == ("yes", "Yes", " yes", " Yes")
    assert answer_token_ids(tok, "yes", "pooled-v1") == [1, 2, 3]  # " Yes" repeats id 1; multi-token skipped
    assert answer_token_ids(tok, "no", "pooled-v1") == [5]
    with pytest.raises(ModelLoadError, match="single tokens"):
        answer_token_ids(_Tok({}), "yes")


def test_released_readout_counts_the_two_lowercase_tokens_only() -> None:
    """PARL's released judge call: a guided choice between "yes" and "no", so p_yes is
    P(yes) / (P(yes) + P(no)) over those two tokens; the pooled read-out (before issue 52) folds
    in Yes, " yes", " Yes" and differs whenever those carry probability."""
    tok = _Tok({"yes": [1], "Yes": [2], " yes": [3], " Yes": [4], "no": [5], "No": [6], " no": [7], " No": [8]})
    assert variants("no") == ("no",) == variants("no", "released")
    assert yes_no_ids(tok) == ([1], [5]) == yes_no_ids(tok, "released")
    assert yes_no_ids(tok, "pooled-v1") == ([1, 2, 3, 4], [5, 6, 7, 8])
    assert answer_vocab(tok) == {"yes": 1, "no": 5}
    probs = {1: 0.30, 2: 0.25, 3: 0.01, 4: 0.01, 5: 0.20, 6: 0.02, 7: 0.005, 8: 0.005}
    lps = {i: math.log(p) for i, p in probs.items()}
    released = p_yes_exact(lps, *yes_no_ids(tok))
    pooled = p_yes_exact(lps, *yes_no_ids(tok, "pooled-v1"))
    assert released == pytest.approx(0.30 / (0.30 + 0.20), abs=1e-12)
    assert pooled == pytest.approx(0.57 / (0.57 + 0.23), abs=1e-12)
    assert abs(released - pooled) > 0.1  # type: ignore[operator]
    assert [side_of(s) for s in ("yes", "no", "Yes", " yes", "NO")] == ["yes", "no", None, None, None]
    with pytest.raises(ValueError, match="read-out"):
        variants("yes", "pooled")  # type: ignore[arg-type]


def test_p_yes_exact_needs_every_variant() -> None:
    lps = {1: math.log(0.3), 2: math.log(0.1), 3: math.log(0.2)}
    assert p_yes_exact(lps, [1, 2], [3]) == pytest.approx(0.4 / 0.6)
    assert p_yes_exact(lps, [1, 2, 4], [3]) is None  # id 4 unknown: not exact


def test_p_yes_bounds_contain_every_completion() -> None:
    yes, no, cap = [math.log(0.3)], [math.log(0.2)], math.log(0.05)
    lo, hi = p_yes_bounds(yes, no, missing_yes=1, missing_no=2, cap=cap)
    assert lo == pytest.approx(0.3 / (0.3 + 0.2 + 0.1)) and hi == pytest.approx(0.35 / 0.55)
    for extra_yes in (0.0, 0.01, 0.05):
        for extra_no in (0.0, 0.03, 0.1):
            assert lo - 1e-12 <= (0.3 + extra_yes) / (0.5 + extra_yes + extra_no) <= hi + 1e-12
    assert p_yes_bounds(yes, no, missing_yes=0, missing_no=0, cap=cap) == pytest.approx((0.6, 0.6))


def test_spellings_and_sides() -> None:
    tok = _Tok({"yes": [1], "Yes": [2], " yes": [3], " Yes": [4, 5], "no": [6]})
    assert answer_spellings(tok, "yes", "pooled-v1") == {"yes": 1, "Yes": 2, " yes": 3}
    assert answer_spellings(tok, "yes") == {"yes": 1}
    assert [side_of(s, "pooled-v1") for s in (" Yes", "NO", "maybe", "yes.")] == ["yes", "no", None, None]
