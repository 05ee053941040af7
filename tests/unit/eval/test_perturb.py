"""The seeded synonym perturbation: deterministic, nested in the rate, case-keeping."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from reward_server.eval.perturb import perturb, read_word_list, synonyms

TEXT = "The largest planet is huge. Many famous people often buy big cars quickly."
ELIGIBLE = {"largest", "planet", "huge", "many", "famous", "people", "often", "buy", "big", "quickly"}  # not "cars"
TABLE = {w: (f"{w}x", f"{w}y") for w in ELIGIBLE}


def test_same_seed_same_output_other_seed_differs() -> None:
    a = perturb(TEXT, 0.5, seed=7)  # the shipped word list
    assert a == perturb(TEXT, 0.5, seed=7) and a.text != TEXT
    assert len({perturb(TEXT, 0.5, seed=s).text for s in range(6)}) > 1
    assert set(synonyms()) >= ELIGIBLE and "cars" not in synonyms()


def test_rate_zero_identity_rate_one_every_eligible_word() -> None:
    zero, full = perturb(TEXT, 0.0, seed=1, table=TABLE), perturb(TEXT, 1.0, seed=1, table=TABLE)
    assert zero.text == TEXT and zero.replaced == 0
    assert (full.eligible, full.replaced, full.words) == (10, 10, 13)
    kept = [w for w in full.text.replace(".", "").split() if w.lower() in ELIGIBLE]
    assert kept == [] and "cars" in full.text and re.search(r"\. Many[xy] ", full.text)  # case kept


def test_higher_rate_replaces_a_superset() -> None:
    words = TEXT.split()
    changed = []
    for r in (0.2, 0.5, 0.8, 1.0):
        out = perturb(TEXT, r, seed=3, table=TABLE)
        changed.append({i for i, (a, b) in enumerate(zip(words, out.text.split(), strict=True)) if a != b})
        assert out.replaced == len(changed[-1]) == round(10 * r)
    assert all(x < y for x, y in itertools.pairwise(changed))


def test_case_kept_and_punctuation_untouched(tmp_path: Path) -> None:
    wl = tmp_path / "w.tsv"
    wl.write_text("# comment\nbig\tlarge\nfast\tquick\n")
    table = read_word_list(wl)
    assert perturb("Big, BIG and big... fast!", 1.0, seed=0, table=table).text == "Large, LARGE and large... quick!"
    wl.write_text("big large\n")
    with pytest.raises(ValueError, match=r"w.tsv:1"):
        read_word_list(wl)
    with pytest.raises(ValueError, match="rate"):
        perturb("x", 1.5, seed=0)
