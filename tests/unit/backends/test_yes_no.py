"""The yes/no fold every LLM judge engine shares, and the numerics under it."""

from __future__ import annotations

import math

import pytest

from reward_server.backends.yes_no import (
    answer_spellings,
    answer_token_ids,
    fold_by_ids,
    p_yes,
    p_yes_bounds,
    p_yes_exact,
    side_of,
    variants,
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
    assert variants("yes") == ("yes", "Yes", " yes", " Yes")
    assert answer_token_ids(tok, "yes") == [1, 2, 3]  # " Yes" repeats id 1; multi-token skipped
    assert answer_token_ids(tok, "no") == [5]
    with pytest.raises(ModelLoadError, match="single tokens"):
        answer_token_ids(_Tok({}), "yes")


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
    assert answer_spellings(tok, "yes") == {"yes": 1, "Yes": 2, " yes": 3}
    assert [side_of(s) for s in (" Yes", "NO", "maybe", "yes.")] == ["yes", "no", None, None]
