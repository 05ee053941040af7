"""Sentence units and template rendering for NLICV (docs/nlicv.md §4).

How ablated texts are wrapped by the templates (our documented choice):

* A constraint's premise is ``premise_template`` rendered with the response, its hypothesis is
  ``correct_template`` / ``aligned_template`` rendered with the answer / preference.
* Units are the sentences of the *filled-in text* (response, answer, preference), never of the
  rendered template: the template words are scaffolding, not propositions.
* Sentences (``nli.sentence_split``): ``released`` = the released code's ``re.split(r'[.]')``,
  pieces stripped, empty ones dropped (the units carry no full stop); ``pysbd-v1`` = pysbd.
* An ablated side is the template re-rendered with the remaining sentences joined as the split
  joins them (released: ``". "``, as ``get_critical_premise`` does; pysbd-v1: one space).
  The unablated side is rendered with the original text untouched, so the main score is exactly
  the released code's pair ``("The answer is {response}.",
  "The content of the answer is about {answer}.")``.
* A side with no sentence left is *empty*: as a premise it entails nothing (score 0, no engine
  call); as a hypothesis it is the empty conjunction, a tautology (entailment restored, no call).
  An unablated side whose text is blank is empty too with ``nli.empty_text=zero``; with
  ``released`` it is rendered (``"The answer is ."``) and empty only if that rendering is blank.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass
from typing import Any, Literal

logger = logging.getLogger(__name__)

_FALLBACK_SPLIT = re.compile(r"(?<=[.!?])\s+|\n\s*\n+")
_RELEASED_SPLIT = re.compile(r"[.]")
SentenceSplit = Literal["released", "pysbd-v1"]


@functools.lru_cache(maxsize=8192)
def released_split(text: str) -> tuple[str, ...]:
    """The released code's units: ``[s.strip() for s in re.split(r'[.]', text) if s.strip()]``."""
    return tuple(s for s in (p.strip() for p in _RELEASED_SPLIT.split(text)) if s)


def units_of(text: str, split: SentenceSplit) -> tuple[str, ...]:
    return released_split(text) if split == "released" else split_sentences(text)


@functools.lru_cache(maxsize=1)
def _segmenter() -> Any:
    try:
        import pysbd
    except ImportError:  # pragma: no cover - pysbd is a server dependency
        logger.warning("pysbd is not installed; splitting sentences on end punctuation")
        return None
    return pysbd.Segmenter(language="en", clean=False)


@functools.lru_cache(maxsize=8192)
def split_sentences(text: str) -> tuple[str, ...]:
    """Sentences of ``text`` (pysbd rules; a regex on ``.!?`` when pysbd is missing or fails).

    Cached: pysbd costs about a millisecond per text, and the same answer, preference and
    ablated sides recur across a request's queries and a GRPO group's rollouts."""
    if not text.strip():
        return ()
    seg = _segmenter()
    parts: list[str]
    if seg is not None:
        try:
            parts = [str(s) for s in seg.segment(text)]
        except Exception:  # pysbd has raised on odd inputs; never lose the text
            logger.warning("pysbd failed on a %d-char text; using the regex splitter", len(text))
            parts = _FALLBACK_SPLIT.split(text)
    else:
        parts = _FALLBACK_SPLIT.split(text)
    return tuple(s for s in (p.strip() for p in parts) if s)


@dataclass(frozen=True)
class Side:
    """One side of an NLI query: a template, the text it wraps, its sentences, what is removed.
    ``split``: how sentences are cut and joined; ``score_blank``: an unablated blank text is
    rendered and scored (``nli.empty_text=released``) rather than empty."""

    template: str
    field: str
    text: str
    removed: frozenset[int] = frozenset()
    split: SentenceSplit = "released"
    score_blank: bool = True

    @classmethod
    def of(cls, template: str, field: str, text: str, *, split: SentenceSplit = "released",
           score_blank: bool = True) -> Side:  # fmt: skip
        return cls(template, field, text, split=split, score_blank=score_blank)

    @property
    def units(self) -> tuple[str, ...]:
        """Sentences of ``text``; split only when asked (evidence, windows), never for a plain score."""
        return units_of(self.text, self.split)

    def without(self, *indices: int) -> Side:
        return Side(self.template, self.field, self.text, self.removed | set(indices), self.split, self.score_blank)

    @property
    def kept(self) -> tuple[str, ...]:
        return tuple(u for i, u in enumerate(self.units) if i not in self.removed)

    @property
    def empty(self) -> bool:
        if not self.removed:  # nothing ablated: no need to split
            if self.score_blank:  # released: only a blank rendering scores 0
                return not self.render().strip()
            return not self.text.strip()
        return not self.kept

    def measured(self, unit: str) -> str:
        """What one unit takes in a joined text, for packing windows (its full stop, released)."""
        return unit + "." if self.split == "released" else unit

    def join(self, units: tuple[str, ...] | list[str]) -> str:
        """Units back into a text, as the split joins them."""
        return (". " if self.split == "released" else " ").join(units)

    def body(self) -> str:
        return self.text if not self.removed else self.join(self.kept)

    def render(self, body: str | None = None) -> str:
        return self.template.format(**{self.field: self.body() if body is None else body})
