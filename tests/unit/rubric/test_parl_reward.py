"""PARL-0/A/B rewards, floors and gates on the deterministic FakeJudge, values computed by hand.

FakeJudge: a rule quoting one word w has p_yes 0.98 when w is in the text, else 0.02; a rule
quoting two words, one present, has 0.5 (not satisfied: satisfied means p_yes > 0.5).
"""

from __future__ import annotations

import json
import math

import pytest

from reward_server.backends.fake import FakeJudge
from reward_server.domain import HistoryItem, ParlRewardSpec, ParlVariant, Task
from reward_server.rubric import RubricSettings, parl_reward

R1 = 'The text uses the word "alpha".'
R2 = 'The text uses the word "beta".'
R3 = 'The text uses the word "gamma".'
R4 = 'The text uses both "alpha" and "zeta".'

HISTORY = (
    HistoryItem("c1", "alpha beta gamma"),
    HistoryItem("c2", "alpha beta delta"),
    HistoryItem("c3", "alpha beta"),
)
TARGET = HistoryItem("ct", "alpha zeta")  # R1 0.98, R2 0.02 -> S_T = 0.5
BASELINES = ("beta", "nothing here", "alpha beta")  # S_b = 0.5, 0.02, 0.98


def rules_json(*rules: str) -> str:
    return json.dumps([{"rule": r} for r in rules])


def spec(output: str, variant: ParlVariant = ParlVariant.PARL_A, **kw: object) -> ParlRewardSpec:
    return ParlRewardSpec(
        history=kw.pop("history", HISTORY),  # type: ignore[arg-type]
        policy_output=output,
        target=TARGET,
        baselines=kw.pop("baselines", BASELINES),  # type: ignore[arg-type]
        variant=variant,
        task=Task.AMAZON,
    )


# Deltas: 0.5-0.5 = 0, 0.5-0.02 = 0.48, 0.5-0.98 = -0.48 (one negative margin); k = 20.
GAMMA = 0.5 * (1 / (1 + math.exp(-9.6))) * (1 / (1 + math.exp(9.6)))


@pytest.mark.parametrize(
    ("variant", "expected"),
    [
        (ParlVariant.PARL_0, 0.1 + 10 * 1.0 * 0.5),
        (ParlVariant.PARL_A, 0.1 + 10 * 1.0 * 0.5 * GAMMA),
        (ParlVariant.PARL_B, 0.1 + 10 * 1.0 * GAMMA),
    ],
)
async def test_variants_exact(variant: ParlVariant, expected: float) -> None:
    judge = FakeJudge()
    out = await parl_reward(judge, spec(rules_json(R1, R2, R3, R4), variant), RubricSettings())
    assert out.policy_invalid is None
    assert out.reward == pytest.approx(expected, rel=1e-9)
    c = out.components
    assert c["n_parsed"] == 4 and c["n_length_ok"] == 4 and c["n_valid"] == 2
    assert c["floor_applied"] == 0.0
    assert c["s_target"] == pytest.approx(0.5)
    assert [c[f"s_baseline.{i}"] for i in range(3)] == pytest.approx([0.5, 0.02, 0.98])
    assert [c[f"delta.{i}"] for i in range(3)] == pytest.approx([0.0, 0.48, -0.48])
    assert c["gamma"] == pytest.approx(GAMMA, rel=1e-9)
    assert c["cardinality"] == 1.0
    # Two batched judge calls: validation (3 items x 4 rules), scoring ((1+3) texts x 2 rules).
    assert list(judge.batch_sizes) == [12, 8]


async def test_linear_cardinality() -> None:
    s = RubricSettings(cardinality="linear")
    out = await parl_reward(FakeJudge(), spec(rules_json(R1, R2), ParlVariant.PARL_0), s)
    assert out.components["cardinality"] == pytest.approx(0.2)
    assert out.reward == pytest.approx(0.1 + 10 * 0.2 * 0.5)


async def test_no_baselines_gamma_is_one() -> None:
    out = await parl_reward(FakeJudge(), spec(rules_json(R1, R2), ParlVariant.PARL_B, baselines=()), RubricSettings())
    assert out.components["gamma"] == 1.0
    assert out.reward == pytest.approx(0.1 + 10.0)


async def test_custom_lambda_k_and_floor() -> None:
    s = RubricSettings(reward_lambda=2.0, margin_k=1.0, format_floor=0.0)
    out = await parl_reward(FakeJudge(), spec(rules_json(R1, R2), ParlVariant.PARL_B), s)
    g = 0.5 * (1 / (1 + math.exp(-0.48))) * (1 / (1 + math.exp(0.48)))
    assert out.reward == pytest.approx(2.0 * g, rel=1e-9)


async def test_too_few_survivors_gets_format_floor() -> None:
    judge = FakeJudge()
    out = await parl_reward(judge, spec(rules_json(R1, R3, R4)), RubricSettings())
    assert out.policy_invalid is None  # a policy outcome with status OK, not malformed
    assert out.reward == pytest.approx(0.1)
    assert out.components["n_valid"] == 1 and out.components["floor_applied"] == 1.0
    assert list(judge.batch_sizes) == [9]  # validation only, no scoring call


async def test_too_many_survivors_gets_format_floor() -> None:
    s = RubricSettings(max_rules=10)
    many = [f'The text uses the word "alpha" (variant {i}).' for i in range(10)]
    out = await parl_reward(FakeJudge(), spec(rules_json(*many)), s)
    assert out.components["n_valid"] == 10 and out.reward > 0.1  # 10 is allowed
    s3 = RubricSettings(max_rules=3)
    out = await parl_reward(FakeJudge(), spec(rules_json(R1, R2, R1)), RubricSettings(max_rules=2))
    assert out.policy_invalid is not None  # 3 parsed > max 2: rejected whole at parse time
    out = await parl_reward(FakeJudge(), spec(rules_json(R1, R2, R1)), s3)
    assert out.reward > 0.1
    s_fewer = RubricSettings(max_rules=3, min_rules=3)
    out = await parl_reward(FakeJudge(), spec(rules_json(R1, R2, R3)), s_fewer)
    assert out.reward == 0.1 and out.components["floor_applied"] == 1.0


@pytest.mark.parametrize(
    ("output", "reason_part"),
    [
        ("not json", "not valid JSON"),
        ('{"rule": "x"}', "expected an array"),
        (rules_json(R1), "1 elements"),
        (rules_json(*([R1] * 11)), "11 elements"),
        (json.dumps([{"rule": R1}, {"criterion": R2}]), 'no "rule"'),
        (json.dumps([{"rule": R1}, {"rule": 3}]), "expected a string"),
        (json.dumps([{"rule": R1}, "just a string"]), "expected an object"),
        ("", "empty output"),
    ],
)
async def test_malformed_outputs_are_policy_invalid(output: str, reason_part: str) -> None:
    judge = FakeJudge()
    out = await parl_reward(judge, spec(output), RubricSettings())
    assert out.reward is None  # the service gives it service.policy_invalid_penalty
    assert out.policy_invalid is not None and reason_part in out.policy_invalid
    assert out.components["n_valid"] == 0 and out.components["floor_applied"] == 1.0
    assert list(judge.batch_sizes) == []  # never reaches the judge


async def test_short_and_long_rules_are_skipped_not_fatal() -> None:
    short = '"alpha"'  # 7 characters < 20
    long = 'The text uses the word "beta". ' + "x" * 400
    judge = FakeJudge()
    out = await parl_reward(judge, spec(rules_json(R1, short, long, R2)), RubricSettings())
    assert out.policy_invalid is None
    assert out.components["n_parsed"] == 4 and out.components["n_length_ok"] == 2
    assert judge.batch_sizes[0] == 3 * 2


async def test_all_rules_filtered_by_length_gives_format_floor_without_judge() -> None:
    judge = FakeJudge()
    out = await parl_reward(judge, spec(rules_json('"a" rule', '"b" rule')), RubricSettings())
    assert out.reward == 0.1 and out.components["n_length_ok"] == 0
    assert list(judge.batch_sizes) == []


async def test_history_limit_uses_last_items_only() -> None:
    # With only the last item ("alpha beta"), R3 (gamma) still fails but R1, R2 pass; with the
    # first item only R3 would pass there. Use a history whose old items would veto R2.
    history = (HistoryItem("old", "gamma"), *HISTORY[1:])
    out_all = await parl_reward(FakeJudge(), spec(rules_json(R1, R2), history=history), RubricSettings())
    assert out_all.components["n_valid"] == 0
    out_last = await parl_reward(
        FakeJudge(), spec(rules_json(R1, R2), history=history), RubricSettings(history_limit=2)
    )
    assert out_last.components["n_valid"] == 2


async def test_early_exit_judges_in_rounds_with_same_result() -> None:
    judge = FakeJudge()
    s = RubricSettings(validation_early_exit=True)
    out = await parl_reward(judge, spec(rules_json(R1, R2, R3, R4)), s)
    full = await parl_reward(FakeJudge(), spec(rules_json(R1, R2, R3, R4)), RubricSettings())
    assert out.reward == full.reward
    # item 1: 4 rules (R4 fails); item 2: 3 rules (R3 fails); item 3: 2 rules; then scoring.
    assert list(judge.batch_sizes) == [4, 3, 2, 8]


async def test_think_block_and_fence_are_stripped_by_lenient_parser() -> None:
    output = "<think>Let me think [not json]</think>\n```json\n" + rules_json(R1, R2) + "\n```"
    out = await parl_reward(FakeJudge(), spec(output, ParlVariant.PARL_0), RubricSettings(parser="lenient"))
    assert out.policy_invalid is None and out.reward == pytest.approx(5.1)
    # the released reward json.loads the fenced text: policy-invalid (PARL's 0.0)
    released = await parl_reward(FakeJudge(), spec(output, ParlVariant.PARL_0), RubricSettings())
    assert released.policy_invalid is not None and "not valid JSON" in released.policy_invalid


R6 = 'The text uses the words "alpha", "beta" and "gamma".'  # 0.98 / 0.66 / 0.66 on HISTORY: valid
R7 = 'The text uses the word "delta".'  # fails on item 0


@pytest.mark.parametrize(
    ("rules", "s_target"),
    [
        # the last length-valid rule (R7) fails first on item 0: its text "alpha beta gamma"
        ((R1, R6, R7), (0.98 + 0.98) / 2),
        # the last rule (R6) holds on every item: the loop ends on the last item, "alpha beta"
        ((R7, R1, R6), (0.98 + 0.66) / 2),
    ],
)
async def test_released_target_overwrite_reproduces_the_amazon_bug(rules: tuple[str, ...], s_target: float) -> None:
    """parl_rm_a.py reuses the name gt (the target text) as its validation loop variable, so the
    released reward judges S(y_T) on the history text that loop judged last. Off (the default):
    the target, "alpha zeta" (R1 0.98, R6 0.34)."""
    on = RubricSettings(released_target_overwrite=True)
    out = await parl_reward(FakeJudge(), spec(rules_json(*rules), ParlVariant.PARL_0), on)
    assert out.components["n_valid"] == 2 and out.components["s_target"] == pytest.approx(s_target)
    assert out.reward == pytest.approx(0.1 + 10 * s_target)
    fixed = await parl_reward(FakeJudge(), spec(rules_json(*rules), ParlVariant.PARL_0), RubricSettings())
    assert fixed.components["s_target"] == pytest.approx((0.98 + 0.02 + 0.96 / 3) / 2)
    early = await parl_reward(FakeJudge(), spec(rules_json(*rules), ParlVariant.PARL_0),
                              RubricSettings(released_target_overwrite=True, validation_early_exit=True))
    assert early.components["s_target"] == pytest.approx(s_target)
