"""PARL's holistic LLM-as-judge baseline: the prompt and the strict parse of its 1-5 answer."""

from __future__ import annotations

import pytest

from reward_server.domain import HistoryItem, Task
from reward_server.rubric.holistic import HOLISTIC_TEMPLATE_VERSION, holistic_request, parse_holistic_score


@pytest.mark.parametrize(
    ("answer", "score"),
    [("4", 4), (" 5\n", 5), ("1.", 1), ("Score: 3", 3), ("score=2", 2), ("3/5", 3), ("<think>hmm, 2?</think>\n4", 4),
     ("1\n\nThe user writes:", 1)],
)
def test_valid_answers(answer: str, score: int) -> None:
    parsed = parse_holistic_score(answer)
    assert (parsed.score, parsed.status) == (score, "ok")
    assert parsed.normalized == pytest.approx((score - 1) / 4)


@pytest.mark.parametrize("answer", ["0", "6", "10", "-3", "Score: 7"])
def test_out_of_range_answers(answer: str) -> None:
    parsed = parse_holistic_score(answer)
    assert (parsed.score, parsed.status, parsed.normalized) == (None, "out_of_range", None)


@pytest.mark.parametrize(
    "answer",
    ["", "four", "4.5", "I would say 4", "4 because it matches", '[{"rule": "x"}]', "3 or 4", "<think>4</think>",
     "1 = nothing like this user, ", "Rating:\n4"],
)
def test_junk_is_unparsable(answer: str) -> None:
    parsed = parse_holistic_score(answer)
    assert (parsed.score, parsed.status) == (None, "unparsable")


def test_prompt_carries_history_context_and_text_greedy() -> None:
    history = [HistoryItem("Article about rain", "Will it ever stop raining?"), HistoryItem("Tax news", "Taxes up?")]
    req = holistic_request(history, context="Article about heat", text="Is summer too hot now?", task=Task.NEWS)
    assert req.temperature == 0.0 and req.max_new_tokens == 8
    assert "Will it ever stop raining?" in req.user and "Taxes up?" in req.user
    assert "## Article\nArticle about heat" in req.user
    assert "## Headline to rate\nIs summer too hot now?" in req.user
    assert req.user.index("Taxes up?") < req.user.index("Is summer too hot now?")
    assert "single digit from 1 to 5" in req.user and HOLISTIC_TEMPLATE_VERSION == "parl-holistic-v1"
