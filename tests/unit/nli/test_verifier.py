"""Constraint scores, regimes and rewards on the set-inclusion FakeNLI (0.98 entails, 0.02 not)."""

from __future__ import annotations

import pytest

from reward_server.backends.fake import FakeNLI
from reward_server.domain import NliConstraintsSpec, NliRewardFunction, Regime
from reward_server.nli import (
    NLISettings,
    VerifyInput,
    nli_constraints_reward,
    reward_of,
    template_versions,
    verify,
    verify_batch,
)

RESPONSE = "Paris is the capital of France. Museums line the river."
CASES = [  # (answer, preference, regime, S_c, S_a)
    ("Paris", "museums", Regime.PERSONALIZATION, 0.98, 0.98),
    ("Paris", "football", Regime.GENERALIZATION, 0.98, 0.02),
    ("Berlin", "museums", Regime.SYCOPHANCY, 0.02, 0.98),
    ("Berlin", "football", Regime.FAILURE, 0.02, 0.02),
]


@pytest.mark.parametrize(("answer", "preference", "regime", "s_c", "s_a"), CASES)
async def test_regimes(answer: str, preference: str, regime: Regime, s_c: float, s_a: float) -> None:
    nli = FakeNLI()
    v = await verify(
        nli,
        response=RESPONSE,
        answer=answer,
        preference=preference,
        evidence=False,
        settings=NLISettings(),
    )
    assert (v.s_correct, v.s_aligned, v.regime, v.truncated) == (s_c, s_a, regime, False)
    assert list(nli.batch_sizes) == [2]  # both constraints in one engine call


async def test_empty_side_scores_zero_without_engine_call() -> None:
    """nli.empty_text=zero (before issue 52); the released default scores the rendered template
    (tests/unit/nli/test_edge_rules.py::test_empty_response_is_scored_as_released)."""
    zero = NLISettings(empty_text="zero")
    nli = FakeNLI()
    v = await verify(
        nli,
        response=RESPONSE,
        answer="  ",
        preference="museums",
        evidence=False,
        settings=zero,
    )
    assert (v.s_correct, v.s_aligned, v.regime) == (0.0, 0.98, Regime.SYCOPHANCY)
    assert list(nli.batch_sizes) == [1]
    nli2 = FakeNLI()
    v2 = await verify(
        nli2,
        response="",
        answer="Paris",
        preference="museums",
        evidence=True,
        settings=zero,
    )
    assert (v2.s_correct, v2.s_aligned, v2.regime) == (0.0, 0.0, Regime.FAILURE)
    assert list(nli2.batch_sizes) == []
    released = FakeNLI()
    await verify(released, response=RESPONSE, answer="  ", preference="museums", evidence=False,
                 settings=NLISettings())
    assert list(released.batch_sizes) == [2]  # "The content of the answer is about   ." is scored


def test_threshold_is_strict() -> None:
    from reward_server.nli import regime_of

    assert regime_of(0.5, 0.51, 0.5) is Regime.SYCOPHANCY
    assert regime_of(0.51, 0.5, 0.5) is Regime.GENERALIZATION
    assert regime_of(0.5, 0.5, 0.5) is Regime.FAILURE


@pytest.mark.parametrize(
    ("function", "answer", "preference", "expected"),
    [
        (NliRewardFunction.REGIME, "Paris", "museums", 1.0),
        (NliRewardFunction.REGIME, "Paris", "football", 0.5),
        (NliRewardFunction.REGIME, "Berlin", "museums", 0.0),
        (NliRewardFunction.ALIGNED_ONLY, "Berlin", "museums", 0.98),
        (NliRewardFunction.PRODUCT, "Paris", "football", 0.98 * 0.02),
        (NliRewardFunction.WEIGHTED_SUM, "Paris", "football", (3 * 0.98 + 1 * 0.02) / 4),
        (None, "Paris", "football", 0.98 * 0.02),  # server default (set to product below)
    ],
)
async def test_reward_functions(
    function: NliRewardFunction | None, answer: str, preference: str, expected: float
) -> None:
    settings = NLISettings(weight_correct=3.0, weight_aligned=1.0, default_reward_function=NliRewardFunction.PRODUCT)
    spec = NliConstraintsSpec(RESPONSE, answer, preference, reward_function=function)
    out = await nli_constraints_reward(FakeNLI(), spec, settings)
    assert out.reward == pytest.approx(expected)
    assert out.policy_invalid is None


async def test_components() -> None:
    spec = NliConstraintsSpec(RESPONSE, "Paris", "football")
    out = await nli_constraints_reward(FakeNLI(), spec, NLISettings())
    assert dict(out.components) == {
        "s_correct": 0.98,
        "s_aligned": 0.02,
        "correct": 1.0,
        "aligned": 0.0,
        "truncated": 0.0,
        "windowed": 0.0,
        "regime.personalization": 0.0,
        "regime.generalization": 1.0,
        "regime.sycophancy": 0.0,
        "regime.failure": 0.0,
    }


async def test_many_items_one_engine_call_and_dedupe() -> None:
    nli = FakeNLI()
    items = [VerifyInput(RESPONSE, a, p) for a, p, *_ in CASES]
    outs = await verify_batch(nli, items, NLISettings())
    assert [reward_of(NliRewardFunction.REGIME, v, NLISettings()) for v in outs] == [1.0, 0.5, 0.0, 0.0]
    # 4 distinct hypotheses over one premise: 8 queries, 4 distinct pairs, one call
    assert list(nli.batch_sizes) == [4]


def test_template_versions_track_templates() -> None:
    a = template_versions(NLISettings())
    b = template_versions(NLISettings(correct_template="It is about {answer}."))
    assert a["nli.constraints"] == "nlicv-v1"
    assert a["nli.templates_sha256"] != b["nli.templates_sha256"]


def test_settings_reject_bad_templates_and_weights() -> None:
    with pytest.raises(ValueError, match="placeholder"):
        NLISettings(premise_template="The answer is {answer}.")
    with pytest.raises(ValueError, match="weight"):
        NLISettings(weight_correct=0.0, weight_aligned=0.0)
    with pytest.raises(ValueError, match="regime_rewards"):
        NLISettings(regime_rewards={"personalization": 1.0})
