"""The fake-engine Score workload and the small helpers shared by the server benchmarks."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from pathlib import Path

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


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid``, all its threads (from /proc)."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
