"""The fake-engine Score workload shared by the server benchmarks."""

from __future__ import annotations

from collections.abc import Sequence

from reward_server import domain as d


def make_items(n: int) -> list[d.ScoreItem]:
    items: list[d.ScoreItem] = []
    for i in range(n):
        if i % 2:
            spec: d.ItemSpec = d.NliConstraintsSpec(
                response=f"Paris is the capital of France. Item {i} likes museums.",
                answer="Paris capital", preference="museums")
        else:
            spec = d.RubricScoreSpec(context="ctx", text=f"Morning coffee number {i}.",
                                     rules=('Mentions "coffee".', 'Mentions "tea".'))
        items.append(d.ScoreItem(f"i{i}", spec))
    return items


def pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]
