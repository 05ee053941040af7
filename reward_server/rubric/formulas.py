"""The PARL formulas of docs/parl.md §4 as pure functions (no judge, no I/O)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from reward_server.domain import ParlVariant
from reward_server.numerics import sigmoid

__all__ = ["cardinality", "margin_product", "parl_value", "rubric_score", "sigmoid"]


def rubric_score(p_yes: Sequence[float]) -> float:
    """S(y; R) = mean over rules of p_yes."""
    if not p_yes:
        raise ValueError("S(y; R) is undefined for an empty rubric")
    return sum(p_yes) / len(p_yes)


def margin_product(deltas: Sequence[float], k: float) -> float:
    """Gamma = prod_b sigma(k * Delta_b); 1.0 without baselines (empty product)."""
    gamma = 1.0
    for d in deltas:
        gamma *= sigmoid(k * d)
    return gamma


def cardinality(n_rules: int, kind: Literal["threshold", "linear"]) -> float:
    """C = min(1, |R|/2) (threshold) or |R|/10 (linear, App. G.2)."""
    if kind == "threshold":
        return min(1.0, n_rules / 2.0)
    return n_rules / 10.0


def parl_value(
    variant: ParlVariant,
    *,
    base: float,
    lam: float,
    card: float,
    s_target: float,
    gamma: float,
) -> float:
    """R_0 = base + lam*C*S_T;  R_A = base + lam*C*S_T*Gamma;  R_B = base + lam*C*Gamma."""
    if variant is ParlVariant.PARL_0:
        return base + lam * card * s_target
    if variant is ParlVariant.PARL_A:
        return base + lam * card * s_target * gamma
    return base + lam * card * gamma
