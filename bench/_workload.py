"""The Score workload, the engines it runs on (fake, or the real small ones) and the small helpers
shared by the server benchmarks."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from pathlib import Path

from reward_server import domain as d

FAKE_ENGINES = "engines={judge: {kind: fake}, nli: {kind: fake}}"
ENGINE_SETS = ("fake", "real")
REAL_LABEL = ("SmolLM2-135M-Instruct judge (transformers, fp32, 1 thread) + NLI cross-encoder of "
              "all-MiniLM-L6-v2's shape with RANDOM weights and its real tokenizer (1 thread)")


def real_nli_model() -> Path:
    """A random-weight 3-way NLI model of all-MiniLM-L6-v2's shape with its real tokenizer (no
    3-way NLI checkpoint exists offline; throughput does not depend on the weights), built once
    under the reward server's cache folder."""
    from reward_server.backends.smollm2 import default_cache_dir
    from reward_server.backends.tiny_models import build_tiny_nli_model

    folder = default_cache_dir() / "bench-nli-minilm-l6-random"
    if not (folder / "config.json").is_file():
        build_tiny_nli_model(folder, shape="minilm-l6")
    return folder


def engines_override(kind: str) -> str:
    """The ``engines=...`` config override of engine set ``kind``: ``fake`` (deterministic
    stand-ins: what the hosting itself costs) or ``real`` (:data:`REAL_LABEL`; one torch thread
    per engine, as deploy/cpu_local.yaml, so in process and on Ray the engines get the same
    threads)."""
    if kind == "fake":
        return FAKE_ENGINES
    if kind != "real":
        raise ValueError(f"engine set {kind!r}; use one of {ENGINE_SETS}")
    return ("engines={judge: {kind: transformers, model: smollm2-local, num_threads: 1, "
            f"forward_batch_size: 16}}, nli: {{kind: transformers, model: '{real_nli_model()}', "
            "num_threads: 1}}")


def make_items(n: int, start: int = 0) -> list[d.ScoreItem]:
    """``n`` items, half rubric_score (2 rules: 2 judge prompts), half nli_constraints (NLI
    pairs); texts numbered from ``start``, so rounds with other starts never repeat a text (the
    NLI token counts an ingress caches would otherwise hide a hop)."""
    items: list[d.ScoreItem] = []
    for i in range(start, start + n):
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
