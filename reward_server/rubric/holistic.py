"""PARL's LLM-as-judge baseline (paper §5.4.1): one holistic 1-5 score per text.

The judge sees what the rubric generator sees, the user's raw history (reference-free: no
ground-truth text), then the context and the text under evaluation, and answers how well the
text matches this user on a 1-5 scale. The score is normalised to [0, 1] by ``(s - 1) / 4``
(:func:`reward_server.rubric.metrics.llm_judge_normalized`).

PARL did not release this prompt: the wording below is OURS (``HOLISTIC_TEMPLATE_VERSION``;
bump it when the wording changes, results are reported with it).

Parsing is strict (:func:`parse_holistic_score`): after stripping a ``<think>...</think>`` block
the answer's first non-empty line must be one integer, optionally written ``Score: N`` or ``N/5``
with a trailing period (later lines are ignored: a model that keeps talking after its digit still
answered); 1..5 is valid, any other integer is *out of range*, anything else is *unparsable*.
Neither is ever turned into a number: the evaluation counts and reports them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from reward_server.backends.base import GenerationRequest
from reward_server.domain import HistoryItem, Task
from reward_server.rubric.templates import TASK_LABELS, WRITING_ONE, render_history

HOLISTIC_TEMPLATE_VERSION = "parl-holistic-v1"

HOLISTIC_SYSTEM = (
    "You are an expert evaluator of personalized writing. You study the writing history of one "
    "user, then rate how well a new text matches the way THIS user writes: style, structure, "
    "tone, content focus and wording. You rate the match to the user, not general quality."
)

HOLISTIC_USER = """Below are {n} {writing} written by the same user, each with its {context_lower}.

{history}

Now a new {writing_one} written for the context below.

## {context_label}
{context}

## {text_label} to rate
{text}

How well does this {text_lower} match the way this user writes? Rate it from 1 (nothing like
this user) to 5 (exactly like this user). Answer with a single digit from 1 to 5 and nothing else."""

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_SCORE = re.compile(r"^(?:score\s*[:=]?\s*)?([+-]?\d+)\s*(?:/\s*5)?\s*\.?$", re.IGNORECASE)

Status = Literal["ok", "out_of_range", "unparsable"]


@dataclass(frozen=True)
class HolisticScore:
    """A parsed answer: ``score`` in 1..5 iff ``status == "ok"``."""

    score: int | None
    status: Status
    answer: str = ""  # the judge's raw answer

    @property
    def normalized(self) -> float | None:
        """``(s - 1) / 4`` in [0, 1], None when the answer is not a valid score."""
        return None if self.score is None else (self.score - 1) / 4


def holistic_request(
    history: Sequence[HistoryItem],
    *,
    context: str,
    text: str,
    task: Task,
    max_new_tokens: int = 8,
) -> GenerationRequest:
    """The holistic judge's prompt for one text (greedy decoding: a score, not a sample)."""
    labels = TASK_LABELS[task]
    items = render_history(history, task)
    user = HOLISTIC_USER.format(
        n=len(history),
        writing=labels.writing,
        writing_one=WRITING_ONE[task],
        context_lower=labels.context.split(" (")[0].lower(),
        history=items or "(no history)",
        context_label=labels.context,
        context=context.strip() or "(none)",
        text_label=labels.text,
        text=text.strip(),
        text_lower=labels.text.lower(),
    )
    return GenerationRequest(
        system=HOLISTIC_SYSTEM, user=user, max_new_tokens=max_new_tokens, temperature=0.0, top_p=1.0
    )


def parse_holistic_score(answer: str) -> HolisticScore:
    """Strict parse of a judge's answer (see module doc)."""
    text = _THINK.sub("", answer).strip()
    m = _SCORE.match(text.split("\n", 1)[0].strip())
    if m is None:
        return HolisticScore(None, "unparsable", answer)
    value = int(m.group(1))
    if not 1 <= value <= 5:
        return HolisticScore(None, "out_of_range", answer)
    return HolisticScore(value, "ok", answer)
