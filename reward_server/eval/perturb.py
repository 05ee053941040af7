"""Seeded synonym perturbation (NLICV Table 1's "rephrase rate"), no download.

The word list ``data/synonyms.tsv`` ships with the project (about 250 common English words, each
with synonyms meant to keep an ordinary sentence's meaning). A word of the text is *eligible*
when its lowercased form is a headword. For one text and seed, the eligible positions are put in
a random order and each is given a random synonym, both drawn from ``random.Random`` seeded by
``(seed, text)``; rate ``r`` replaces the first ``round(r * eligible)`` positions of that order.
So the same (text, rate, seed) always gives the same output, on any machine and Python version,
a higher rate replaces a superset of a lower rate's words, rate 0 returns the text unchanged
and rate 1 replaces every eligible word. Capitalisation of the replaced word is kept (Title,
UPPER); everything else of the text (punctuation, spacing, other words) is left as it was.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

WORD_LIST = Path(__file__).resolve().parent / "data" / "synonyms.tsv"
_WORD = re.compile(r"[A-Za-z]+(?:-[A-Za-z]+)*")


@dataclass(frozen=True)
class Perturbed:
    text: str
    replaced: int  # words replaced
    eligible: int  # words of the text that have a synonym
    words: int  # words of the text


def read_word_list(path: Path) -> dict[str, tuple[str, ...]]:
    """headword -> synonyms, from ``headword<TAB>syn[,syn...]`` lines (``#`` comments)."""
    table: dict[str, tuple[str, ...]] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        head, sep, rest = line.partition("\t")
        synonyms = tuple(s.strip() for s in rest.split(",") if s.strip())
        if not sep or not head.strip() or not synonyms:
            raise ValueError(f"{path}:{n}: expected 'word<TAB>synonym[,synonym...]'")
        table[head.strip().lower()] = synonyms
    return table


@lru_cache(maxsize=4)
def synonyms(path: Path = WORD_LIST) -> dict[str, tuple[str, ...]]:
    return read_word_list(path)


def _cased(word: str, like: str) -> str:
    if like.isupper() and len(like) > 1:
        return word.upper()
    if like[:1].isupper():
        return word[:1].upper() + word[1:]
    return word


def perturb(text: str, rate: float, *, seed: int, table: dict[str, tuple[str, ...]] | None = None) -> Perturbed:
    """Replace ``round(rate * eligible)`` words of ``text`` by synonyms (see module doc)."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate must be in [0, 1], got {rate}")
    table = synonyms() if table is None else table
    matches = list(_WORD.finditer(text))
    eligible = [k for k, m in enumerate(matches) if m.group().lower() in table]
    rng = random.Random(f"{seed}\x00{text}")
    order = list(eligible)
    rng.shuffle(order)
    choice = {k: rng.choice(table[matches[k].group().lower()]) for k in order}
    n = math.floor(rate * len(eligible) + 0.5)
    chosen = set(order[:n])
    out: list[str] = []
    at = 0
    for k, m in enumerate(matches):
        if k in chosen:
            out.append(text[at : m.start()])
            out.append(_cased(choice[k], m.group()))
            at = m.end()
    out.append(text[at:])
    return Perturbed("".join(out), n, len(eligible), len(matches))
