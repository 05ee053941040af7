"""Evidence by ablation (docs/nlicv.md §4, NLICV App. B, Algorithms 1 and 2).

With ``f`` the entailment score, ``tau`` the threshold, ``P`` the premise units (sentences of the
response) and ``H`` the hypothesis units (sentences of the answer or preference):

* critical premise unit ``p``: ``f(P, H) > tau`` and ``f(P \\ {p}, H) <= tau`` (Algorithm 1).
  ``evidence_mode="cumulative"`` follows the released code instead: units are visited in order
  and each one found non-critical stays removed for the later ablations.
* critical hypothesis unit ``h``: ``f(H \\ {h}, H) <= tau`` (Algorithm 1 literally: the rest of
  the hypothesis, as a premise, no longer entails the whole hypothesis).
* evidence-constraint pair ``(p, h)``: ``p`` critical, ``f(P \\ {p}, H) <= tau`` and
  ``f(P \\ {p}, H \\ {h}) > tau`` (Algorithm 2).

Empty sides (see :mod:`reward_server.nli.text`): an empty premise scores 0, so a one-sentence
premise is critical whenever it entails at all, and a one-sentence hypothesis is always critical;
an empty hypothesis is a tautology, so with a one-sentence hypothesis every critical premise unit
whose removal breaks entailment pairs with it. None of these take an engine call.

Algorithm 1 needs ``1 + m + n + m*n`` queries at most per constraint; they are all planned up
front (the ``m*n`` second-order candidates too, so that the whole request is one engine pass).
Cumulative mode adds one pass per premise sentence whose ablated premise was not already scored.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reward_server.domain import ConstraintEvidence, EvidencePair
from reward_server.nli.batch import Query, QueryBatch
from reward_server.nli.text import Side


@dataclass
class EvidencePlan:
    """The ablation queries for one constraint, and their reading."""

    constraint: str
    premise: Side
    hypothesis: Side
    tau: float
    pruned: set[int] = field(default_factory=set)  # cumulative mode: non-critical, kept removed
    cumulative_critical: list[int] = field(default_factory=list)

    @property
    def m(self) -> int:
        return len(self.premise.units)

    @property
    def n(self) -> int:
        return len(self.hypothesis.units)

    def queries(self) -> list[Query]:
        """Algorithm 1 and every Algorithm 2 candidate (empty sides are skipped by the batch)."""
        p, h = self.premise, self.hypothesis
        out: list[Query] = [(p, h)]
        out += [(p.without(i), h) for i in range(self.m)]
        out += [(h.without(j), h) for j in range(self.n)]
        out += [(p.without(i), h.without(j)) for i in range(self.m) for j in range(self.n)]
        return out

    def cumulative_query(self, i: int) -> Query:
        return (self.premise.without(i, *self.pruned), self.hypothesis)

    def step_cumulative(self, i: int, batch: QueryBatch) -> None:
        if batch.get(*self.cumulative_query(i)).score > self.tau:
            self.pruned.add(i)
        else:
            self.cumulative_critical.append(i)

    def entails(self, batch: QueryBatch) -> bool:
        return batch.get(self.premise, self.hypothesis).score > self.tau

    def read(self, batch: QueryBatch, *, cumulative: bool) -> ConstraintEvidence:
        p, h, tau = self.premise, self.hypothesis, self.tau
        s0 = batch.get(p, h).score
        critical_p: list[int] = []
        if s0 > tau:
            if cumulative:
                critical_p = list(self.cumulative_critical)
            else:
                critical_p = [i for i in range(self.m) if batch.get(p.without(i), h).score <= tau]
        critical_h = [j for j in range(self.n) if batch.get(h.without(j), h).score <= tau]
        pairs: list[EvidencePair] = []
        for i in critical_p:
            if batch.get(p.without(i), h).score > tau:
                continue  # Algorithm 2's guard (only reachable in cumulative mode)
            for j in critical_h:
                h_rest = h.without(j)
                restored = h_rest.empty or batch.get(p.without(i), h_rest).score > tau
                if restored:
                    pairs.append(EvidencePair(i, j))
        return ConstraintEvidence(
            constraint=self.constraint,
            score=s0,
            premise_units=p.units,
            hypothesis_units=h.units,
            critical_premise=tuple(critical_p),
            critical_hypothesis=tuple(critical_h),
            pairs=tuple(pairs),
        )


async def run_cumulative(plans: list[EvidencePlan], batch: QueryBatch) -> None:
    """Released-code pruning: one pass per premise position, all plans of the request together.

    ``batch`` must already hold the Algorithm 1 scores (the base scores decide who takes part).
    """
    active = [pl for pl in plans if pl.entails(batch)]
    for i in range(max((pl.m for pl in active), default=0)):
        step = [pl for pl in active if i < pl.m]
        batch.add_all([pl.cumulative_query(i) for pl in step])
        await batch.run()
        for pl in step:
            pl.step_cumulative(i, batch)
