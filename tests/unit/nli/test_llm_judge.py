"""NLICV's LLM-as-judge baseline: strict JSON parse of Correct/Aligned and the regime it maps to."""

from __future__ import annotations

import pytest

from reward_server.domain import Regime
from reward_server.nli.llm_judge import judge_request, parse_judge_answer


@pytest.mark.parametrize(
    ("answer", "sc", "sa", "regime"),
    [
        ('{"correct": 0.9, "aligned": 0.8}', 0.9, 0.8, Regime.PERSONALIZATION),
        ('{"Correct": 1, "Aligned": 0}', 1.0, 0.0, Regime.GENERALIZATION),
        ('{"correct": false, "aligned": true}', 0.0, 1.0, Regime.SYCOPHANCY),
        ('Reasoning: the answer is wrong.\n{"correct": 0.1, "aligned": 0.5, "why": "x"}', 0.1, 0.5, Regime.FAILURE),
        ('<think>{"correct": 0.9, "aligned": 0.9}</think>{"correct": 0.2, "aligned": 0.7}', 0.2, 0.7,
         Regime.SYCOPHANCY),
        ('{"correct": 0.3, "aligned": 0.3} then {"correct": 0.6, "aligned": 0.9}', 0.6, 0.9, Regime.PERSONALIZATION),
    ],
)
def test_valid_answers(answer: str, sc: float, sa: float, regime: Regime) -> None:
    v = parse_judge_answer(answer)
    assert (v.status, v.s_correct, v.s_aligned) == ("ok", sc, sa)
    assert v.regime(0.5) is regime


@pytest.mark.parametrize("answer", ['{"correct": 1.5, "aligned": 0.2}', '{"correct": 0.5, "aligned": -0.1}'])
def test_out_of_range(answer: str) -> None:
    v = parse_judge_answer(answer)
    assert (v.status, v.s_correct, v.regime(0.5)) == ("out_of_range", None, None)


@pytest.mark.parametrize(
    "answer",
    ["", "yes and yes", '{"correct": 0.9}', '{"correct": "high", "aligned": 0.2}', '[0.9, 0.1]',
     '{"correct": NaN, "aligned": 0.1}', '{"correct": 0.9, "aligned": 0.1',
     '<think>{"correct": 1, "aligned": 1}</think>'],
)  # fmt: skip
def test_junk_is_unparsable(answer: str) -> None:
    v = parse_judge_answer(answer)
    assert (v.status, v.s_correct, v.s_aligned, v.regime(0.5)) == ("unparsable", None, None, None)


def test_request_shows_the_verifier_inputs() -> None:
    req = judge_request(response="Paris, city of museums.", answer="Paris", preference="museums")
    assert "## Response\nParis, city of museums." in req.user
    assert "## Correct answer\nParis" in req.user and "## User preference\nmuseums" in req.user
    assert '{"correct": <number>, "aligned": <number>}' in req.user and req.temperature == 0.0
