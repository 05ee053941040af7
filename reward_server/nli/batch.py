"""Collect every NLI query of a request, dedupe, and score them in one engine call.

A *query* is ``f(premise_side, hypothesis_side)``. Under ``long_premise="windows"`` a query whose
rendered pair does not fit ``engine.max_length`` is split into sentence windows (consecutive
premise sentences packed greedily so that each window, the template scaffolding, the hypothesis
and ``window_reserved_tokens`` fit); its score is the max over windows. Under ``"truncate"`` the
engine cuts the premise and says so. Either way the query reports whether any of its pairs was
truncated, and whether it was windowed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from reward_server.backends.base import NLIEngine, NLIPair, NLIScore
from reward_server.errors import EngineError
from reward_server.nli.settings import NLISettings
from reward_server.nli.text import Side

logger = logging.getLogger(__name__)

Query = tuple[Side, Side]


@dataclass(frozen=True)
class QueryScore:
    score: float
    truncated: bool = False
    windowed: bool = False


def pack_windows(units: Sequence[str], counts: Sequence[int], budget: int) -> list[tuple[str, ...]]:
    """Greedy consecutive packing of ``units`` into windows of at most ``budget`` tokens.

    A unit longer than the budget gets a window of its own (the engine will truncate it).
    """
    windows: list[tuple[str, ...]] = []
    current: list[str] = []
    used = 0
    for unit, n in zip(units, counts, strict=True):
        if current and used + n > budget:
            windows.append(tuple(current))
            current, used = [], 0
        current.append(unit)
        used += n
    if current:
        windows.append(tuple(current))
    return windows


class QueryBatch:
    """Queries in, scores out; each :meth:`run` is at most one ``engine.entailment`` call."""

    def __init__(self, nli: NLIEngine, settings: NLISettings) -> None:
        self._nli = nli
        self._settings = settings
        self._pending: list[Query] = []
        self._plans: dict[Query, tuple[list[NLIPair], bool]] = {}
        self._scores: dict[NLIPair, NLIScore] = {}
        self.engine_calls = 0

    def add(self, premise: Side, hypothesis: Side) -> None:
        query = (premise, hypothesis)
        if query not in self._plans and not premise.empty and not hypothesis.empty:
            self._plans[query] = ([], False)
            self._pending.append(query)

    def add_all(self, queries: Sequence[Query]) -> None:
        for p, h in queries:
            self.add(p, h)

    async def _plan_pending(self) -> None:
        pending, self._pending = self._pending, []
        if self._settings.long_premise != "windows":
            for p, h in pending:
                self._plans[(p, h)] = ([NLIPair(p.render(), h.render())], False)
            return
        texts: dict[str, int] = {}
        for p, h in pending:
            for t in (p.render(), h.render(), p.render(""), *(p.measured(u) for u in p.kept)):
                texts.setdefault(t, 0)
        keys = list(texts)
        for t, n in zip(keys, await self._nli.token_counts(keys), strict=True):
            texts[t] = n
        limit = self._nli.max_length - self._settings.window_reserved_tokens
        for p, h in pending:
            premise, hyp = p.render(), h.render()
            if texts[premise] + texts[hyp] <= limit or len(p.kept) < 2:
                self._plans[(p, h)] = ([NLIPair(premise, hyp)], False)
                continue
            budget = limit - texts[hyp] - texts[p.render("")]
            if budget <= 0:
                logger.warning("hypothesis leaves no room for a premise window; truncating")
                self._plans[(p, h)] = ([NLIPair(premise, hyp)], False)
                continue
            windows = pack_windows(p.kept, [texts[p.measured(u)] for u in p.kept], budget)
            pairs = [NLIPair(p.render(p.join(w)), hyp) for w in windows]
            self._plans[(p, h)] = (pairs, len(pairs) > 1)

    async def run(self) -> None:
        """Score every query added since the last run (one engine call, deduped pairs)."""
        await self._plan_pending()
        todo: dict[NLIPair, None] = {}
        for pairs, _ in self._plans.values():
            for pair in pairs:
                if pair not in self._scores:
                    todo.setdefault(pair, None)
        if not todo:
            return
        batch = list(todo)
        self.engine_calls += 1
        scores = await self._nli.entailment(batch)
        if len(scores) != len(batch):
            raise EngineError(
                f"NLI engine {self._nli.model_id} returned {len(scores)} scores for "
                f"{len(batch)} pairs; the engine is broken"
            )
        self._scores.update(zip(batch, scores, strict=True))

    def get(self, premise: Side, hypothesis: Side) -> QueryScore:
        """The score of a query; empty premise or hypothesis scores 0 without an engine call."""
        if premise.empty or hypothesis.empty:
            return QueryScore(0.0)
        pairs, windowed = self._plans[(premise, hypothesis)]
        results = [self._scores[p] for p in pairs]
        return QueryScore(
            max(r.entailment for r in results), any(r.truncated for r in results), windowed
        )
