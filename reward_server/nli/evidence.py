"""Evidence by ablation (docs/nlicv.md §4, NLICV App. B, Algorithms 1 and 2).

With ``f`` the entailment score, ``tau`` the threshold, ``P`` the premise units (sentences of the
response) and ``H`` the hypothesis units (sentences of the answer or preference):

* critical premise unit ``p``: ``f(P, H) > tau`` and ``f(P \\ {p}, H) <= tau`` (Algorithm 1).
* critical hypothesis unit ``h``: ``f(H \\ {h}, H) <= tau`` (Algorithm 1 literally: the rest of
  the hypothesis, as a premise, no longer entails the whole hypothesis).
* evidence-constraint pair ``(p, h)``: ``p`` critical, ``f(P \\ {p}, H) <= tau`` and
  ``f(P \\ {p}, H \\ {h}) > tau`` (Algorithm 2).

``evidence_mode="cumulative"`` follows the released code's ``get_critical_premise`` and
``get_critical_hypothesis`` instead, on both sides: units are visited in order and each one
found non-critical stays removed for the later ablations; the hypothesis side takes part only
when the hypothesis entails itself, ``f(H, H) > tau`` (a one-sentence hypothesis is critical
without that check, as in the released code). Pairs are read the same way in both modes.

Two readings follow the released code by default (``nli.pair_rule``, ``nli.no_critical``):
a pair restores entailment when ``f(P \\ {p}, H \\ {h}) >= tau`` (``gt``: ``> tau``, Algorithm 2), and
a side with no critical unit reports the whole text, every unit, as critical (the released
``get_critical_premise`` / ``get_critical_hypothesis`` return ``[text]``; ``none``: no unit).

Empty sides (see :mod:`reward_server.nli.text`): an empty premise scores 0, so a one-sentence
premise is critical whenever it entails at all, and a one-sentence hypothesis is always critical;
an empty hypothesis is a tautology, so with a one-sentence hypothesis every critical premise unit
whose removal breaks entailment pairs with it. None of these take an engine call. Every
comparison is strict (``> tau`` holds, ``<= tau`` breaks): a score of exactly ``tau`` does not
entail (but the pair restoration under ``pair_rule=ge``).

Algorithm 1 needs ``1 + m + n + m*n`` queries at most per constraint; they are all planned up
front (the ``m*n`` second-order candidates too, so that the whole request is one engine pass).
Cumulative mode adds ``f(H, H)`` (several hypothesis units) to that pass, then one pass per unit position whose ablated
side was not already scored (premise and hypothesis steps of the same position share a pass).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from reward_server.domain import ConstraintEvidence, EvidencePair
from reward_server.nli.batch import Query, QueryBatch
from reward_server.nli.text import Side

SideName = Literal["premise", "hypothesis"]


@dataclass
class _Pruning:
    """Released-code pruning over one side: non-critical units stay removed."""

    size: int
    pruned: set[int] = field(default_factory=set)
    critical: list[int] = field(default_factory=list)


@dataclass
class EvidencePlan:
    """The ablation queries for one constraint, and their reading."""

    constraint: str
    premise: Side
    hypothesis: Side
    tau: float
    cumulative: bool = False
    pair_ge: bool = False  # a pair restores entailment at >= tau (released), not > tau
    whole_text: bool = False  # no critical unit on a side: every unit is (released)
    _pruning: dict[SideName, _Pruning] = field(default_factory=dict)

    @property
    def m(self) -> int:
        return len(self.premise.units)

    @property
    def n(self) -> int:
        return len(self.hypothesis.units)

    def queries(self) -> list[Query]:
        """Algorithm 1 and every Algorithm 2 candidate (empty sides are skipped by the batch);
        in cumulative mode also ``f(H, H)`` when the hypothesis has several units."""
        p, h = self.premise, self.hypothesis
        out: list[Query] = [(p, h)]
        out += [(p.without(i), h) for i in range(self.m)]
        out += [(h.without(j), h) for j in range(self.n)]
        out += [(p.without(i), h.without(j)) for i in range(self.m) for j in range(self.n)]
        if self.cumulative and self.n > 1:
            out.append((h, h))
        return out

    def entails(self, batch: QueryBatch) -> bool:
        return batch.get(self.premise, self.hypothesis).score > self.tau

    def hypothesis_entails_itself(self, batch: QueryBatch) -> bool:
        """The released code's ``f(H, H) > tau`` check before pruning the hypothesis."""
        return batch.get(self.hypothesis, self.hypothesis).score > self.tau

    def start_cumulative(self, batch: QueryBatch) -> list[SideName]:
        """The sides that prune (``batch`` holds the first pass): the premise when the constraint
        holds, the hypothesis when it has several units and entails itself."""
        sides: list[SideName] = []
        if self.entails(batch):
            sides.append("premise")
        if self.n > 1 and self.hypothesis_entails_itself(batch):
            sides.append("hypothesis")
        self._pruning = {s: _Pruning(self.m if s == "premise" else self.n) for s in sides}
        return sides

    def cumulative_query(self, side: SideName, k: int) -> Query | None:
        """The ablation of unit ``k`` on ``side`` with the pruned units removed (None: no unit k)."""
        state = self._pruning.get(side)
        if state is None or k >= state.size:
            return None
        if side == "premise":
            return (self.premise.without(k, *state.pruned), self.hypothesis)
        return (self.hypothesis.without(k, *state.pruned), self.hypothesis)

    def step_cumulative(self, side: SideName, k: int, batch: QueryBatch) -> None:
        query = self.cumulative_query(side, k)
        if query is None:
            return
        state = self._pruning[side]
        if batch.get(*query).score > self.tau:
            state.pruned.add(k)
        else:
            state.critical.append(k)

    def _critical(self, batch: QueryBatch) -> tuple[list[int], list[int]]:
        critical_p, critical_h = self._critical_units(batch)
        if self.whole_text:  # released: the text itself when nothing is critical
            critical_p = critical_p or list(range(self.m))
            critical_h = critical_h or list(range(self.n))
        return critical_p, critical_h

    def _critical_units(self, batch: QueryBatch) -> tuple[list[int], list[int]]:
        p, h, tau = self.premise, self.hypothesis, self.tau
        if self.cumulative:
            prem = self._pruning.get("premise")
            hyp = self._pruning.get("hypothesis")
            critical_p = list(prem.critical) if prem is not None else []
            if self.n == 1:  # released code: a one-sentence hypothesis is critical, no check
                critical_h = [0]
            else:
                critical_h = list(hyp.critical) if hyp is not None else []
            return critical_p, critical_h
        critical_p = []
        if batch.get(p, h).score > tau:
            critical_p = [i for i in range(self.m) if batch.get(p.without(i), h).score <= tau]
        critical_h = [j for j in range(self.n) if batch.get(h.without(j), h).score <= tau]
        return critical_p, critical_h

    def read(self, batch: QueryBatch) -> ConstraintEvidence:
        p, h, tau = self.premise, self.hypothesis, self.tau
        critical_p, critical_h = self._critical(batch)
        pairs: list[EvidencePair] = []
        for i in critical_p:
            if batch.get(p.without(i), h).score > tau:
                continue  # Algorithm 2's guard (only reachable in cumulative mode)
            for j in critical_h:
                h_rest = h.without(j)
                score = 1.0 if h_rest.empty else batch.get(p.without(i), h_rest).score
                restored = score >= tau if self.pair_ge else score > tau
                if restored:
                    pairs.append(EvidencePair(i, j))
        return ConstraintEvidence(
            constraint=self.constraint,
            score=batch.get(p, h).score,
            premise_units=p.units,
            hypothesis_units=h.units,
            critical_premise=tuple(critical_p),
            critical_hypothesis=tuple(critical_h),
            pairs=tuple(pairs),
        )


async def run_cumulative(plans: list[EvidencePlan], batch: QueryBatch) -> None:
    """Released-code pruning: one pass per unit position, all plans and both sides together.

    ``batch`` must already hold the first pass (``plan.queries()``): the base scores and
    ``f(H, H)`` decide which sides take part.
    """
    active = [(pl, side) for pl in plans for side in pl.start_cumulative(batch)]
    k = 0
    while True:
        step = [(pl, side) for pl, side in active if pl.cumulative_query(side, k) is not None]
        if not step:
            return
        for pl, side in step:
            query = pl.cumulative_query(side, k)
            assert query is not None
            batch.add(*query)
        await batch.run()
        for pl, side in step:
            pl.step_cumulative(side, k, batch)
        k += 1
