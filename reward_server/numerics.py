"""Numerically stable scalar helpers shared by the engines and the science (no dependencies).

``sigmoid`` and ``logsumexp`` exist once here; the judge engines fold yes/no log-probs with
them and the PARL margin product uses the same ``sigmoid``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def sigmoid(x: float) -> float:
    """The logistic function, without overflow for large ``|x|``."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def logsumexp(xs: Iterable[float]) -> float:
    """``log(sum(exp(x)))`` without overflow; ValueError on an empty input."""
    values = list(xs)
    if not values:
        raise ValueError("logsumexp of an empty sequence")
    m = max(values)
    if math.isinf(m):
        return m
    return m + math.log(sum(math.exp(x - m) for x in values))


def p_yes_from_logits(l_yes: float, l_no: float) -> float:
    """``P(yes) / (P(yes) + P(no))`` from the two (folded) log-probs or logits."""
    return sigmoid(l_yes - l_no)
