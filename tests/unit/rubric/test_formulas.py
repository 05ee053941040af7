"""The PARL formulas of docs/parl.md §4, by hand."""

from __future__ import annotations

import math

import pytest

from reward_server.domain import ParlVariant
from reward_server.rubric import formulas as f


def test_sigmoid_stable_at_extremes() -> None:
    assert f.sigmoid(0.0) == 0.5
    assert f.sigmoid(1000.0) == 1.0 and f.sigmoid(-1000.0) == 0.0  # no OverflowError
    assert f.sigmoid(2.0) == pytest.approx(1 / (1 + math.exp(-2.0)))


def test_margin_product_and_cardinality() -> None:
    # Deltas 0.1 and -0.05 with k = 20: sigma(2) * sigma(-1)
    assert f.margin_product([0.1, -0.05], 20.0) == pytest.approx((1 / (1 + math.exp(-2))) * (1 / (1 + math.e)))
    assert f.margin_product([], 20.0) == 1.0
    assert [f.cardinality(n, "threshold") for n in (1, 2, 7)] == [0.5, 1.0, 1.0]
    assert [f.cardinality(n, "linear") for n in (1, 2, 10)] == [0.1, 0.2, 1.0]
    with pytest.raises(ValueError):
        f.rubric_score([])


def test_parl_values() -> None:
    kw = {"base": 0.1, "lam": 10.0, "card": 0.5, "s_target": 0.8, "gamma": 0.25}
    assert f.parl_value(ParlVariant.PARL_0, **kw) == pytest.approx(0.1 + 10 * 0.5 * 0.8)  # type: ignore[arg-type]
    assert f.parl_value(ParlVariant.PARL_A, **kw) == pytest.approx(0.1 + 10 * 0.5 * 0.8 * 0.25)  # type: ignore[arg-type]
    assert f.parl_value(ParlVariant.PARL_B, **kw) == pytest.approx(0.1 + 10 * 0.5 * 0.25)  # type: ignore[arg-type]
