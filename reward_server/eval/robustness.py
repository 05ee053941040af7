"""NLICV Table 1: positive/negative (response, reference) pairs, before and after perturbation.

For each rephrase rate (the responses perturbed by :mod:`reward_server.eval.perturb`, the
references left as they are) and each method: Pos (mean score of the positive pairs), Neg (of
the negatives) and Acc (share of pairs classified right), then the Std (population standard
deviation over the rates) and Mean rows, as in the paper.

Methods and their decision rules:

- the NLI verifier: the score is S_c with the reference as the answer a (the verifier's own
  templates and long-premise policy), positive iff S_c > tau (``nli.threshold``), never fitted;
- each classic metric: positive iff score > t, where t is, under ``threshold="fit"`` (default),
  the threshold with the best accuracy on the UNPERTURBED pairs (the midpoint between two
  consecutive distinct scores; the lowest such midpoint on ties), then held fixed for every
  rate: the most favourable choice for the metric at rate 0, so what changes with the rate is
  robustness alone. A number instead (e.g. 0.5, the paper's fixed cut) is used as given.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reward_server.eval.common import read_jsonl
from reward_server.eval.perturb import WORD_LIST, perturb

DEFAULT_RATES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
_LABELS = {"positive": True, "pos": True, "1": True, "true": True,
           "negative": False, "neg": False, "0": False, "false": False}  # fmt: skip


@dataclass(frozen=True)
class Pair:
    pair_id: str
    response: str
    reference: str
    positive: bool


def read_pairs(path: Path) -> list[Pair]:
    """``{"id"?, "response", "reference", "label": positive|negative}`` per line."""
    out: list[Pair] = []
    for n, rec in read_jsonl(path):
        if not (isinstance(rec.get("response"), str) and isinstance(rec.get("reference"), str)):
            raise ValueError(f"{path}:{n}: response and reference must be strings")
        label = _LABELS.get(str(rec.get("label")).strip().lower())
        if label is None:
            raise ValueError(f"{path}:{n}: label must be positive or negative, got {rec.get('label')!r}")
        out.append(Pair(str(rec.get("id", n)), rec["response"], rec["reference"], label))
    if not any(p.positive for p in out) or all(p.positive for p in out):
        raise ValueError(f"{path}: needs both positive and negative pairs")
    return out


def fit_threshold(scores: Sequence[float], positive: Sequence[bool]) -> float:
    """The cut with the best accuracy (positive iff score > t); see module doc."""
    values = sorted(set(scores))
    candidates = [values[0] - 1e-9] + [(a + b) / 2 for a, b in itertools.pairwise(values)]
    best, best_acc = candidates[0], -1.0
    for t in candidates:
        acc = accuracy(scores, positive, t)
        if acc > best_acc:
            best, best_acc = t, acc
    return best


def accuracy(scores: Sequence[float], positive: Sequence[bool], threshold: float) -> float:
    return sum(1 for s, y in zip(scores, positive, strict=True) if (s > threshold) == y) / len(scores)


def _cell(scores: Sequence[float], positive: Sequence[bool], threshold: float) -> dict[str, float]:
    pos = [s for s, y in zip(scores, positive, strict=True) if y]
    neg = [s for s, y in zip(scores, positive, strict=True) if not y]
    return {"pos": sum(pos) / len(pos), "neg": sum(neg) / len(neg), "acc": accuracy(scores, positive, threshold)}


def table(
    scores: Mapping[str, Mapping[float, Sequence[float]]],
    positive: Sequence[bool],
    *,
    thresholds: Mapping[str, float | str],
    nli_methods: Sequence[str] = (),
    nli_tau: float = 0.5,
) -> dict[str, Any]:
    """Rows per rate, Std and Mean, from method -> rate -> per-pair scores."""
    rates = sorted({r for by_rate in scores.values() for r in by_rate})
    cut: dict[str, dict[str, Any]] = {}
    for m, by_rate in scores.items():
        if m in nli_methods:
            cut[m] = {"threshold": nli_tau, "rule": "S_c > nli.threshold (the verifier's own rule)"}
            continue
        rule = thresholds.get(m, "fit")
        if rule == "fit":
            t = fit_threshold(by_rate[rates[0]], positive)
            cut[m] = {"threshold": t, "rule": f"best accuracy on rate {rates[0]} pairs, held fixed"}
        else:
            cut[m] = {"threshold": float(rule), "rule": "fixed, as given"}
    rows: list[dict[str, Any]] = []
    for r in rates:
        rows.append({"rate": r, "methods": {m: _cell(s[r], positive, cut[m]["threshold"]) for m, s in scores.items()}})
    agg: dict[str, dict[str, dict[str, float]]] = {"std": {}, "mean": {}}
    for m in scores:
        for k in ("pos", "neg", "acc"):
            col = [row["methods"][m][k] for row in rows]
            agg["std"].setdefault(m, {})[k] = statistics.pstdev(col) if len(col) > 1 else 0.0
            agg["mean"].setdefault(m, {})[k] = statistics.fmean(col)
    return {"rates": rates, "decision": cut, "rows": rows, **agg}


def perturbed_responses(pairs: Sequence[Pair], rates: Sequence[float], *, seed: int) -> dict[float, dict[str, Any]]:
    """rate -> {"responses": [...], "replaced_share": replaced words / words over all responses}."""
    out: dict[float, dict[str, Any]] = {}
    for r in rates:
        done = [perturb(p.response, r, seed=seed) for p in pairs]
        words = sum(d.words for d in done)
        out[r] = {
            "responses": [d.text for d in done],
            "replaced_share": sum(d.replaced for d in done) / words if words else math.nan,
            "eligible_share": sum(d.eligible for d in done) / words if words else math.nan,
        }
    return out


def describe(pairs: Sequence[Pair], *, seed: int) -> dict[str, Any]:
    return {
        "n_pairs": len(pairs),
        "n_positive": sum(1 for p in pairs if p.positive),
        "n_negative": sum(1 for p in pairs if not p.positive),
        "seed": seed,
        "perturbation": f"synonym replacement, word list {WORD_LIST.name} (reward_server/eval/perturb.py)",
    }

