"""NLICV's LLM-as-judge baseline (paper Table 3): the judge answers Correct and Aligned as JSON.

The judge gets the same three strings as the NLI verifier (response, correct answer, user
preference) and answers ``{"correct": c, "aligned": a}`` with c, a in [0, 1] (its confidence
that the constraint holds; ``true``/``false`` read as 1/0). The pair then goes through the
verifier's own rule (:func:`reward_server.nli.verifier.regime_of`, satisfied iff > tau), so the
judge's confusion matrix and Mean Acc sit beside the verifier's. The paper's judges reason step
by step before their JSON; ours are asked for the JSON alone (cheaper), and the parser takes the
LAST JSON object of the answer, after any ``<think>...</think>`` block, so a model that reasons
first still parses.

The wording is OURS (``JUDGE_TEMPLATE_VERSION``); bump it when it changes. Parsing is strict:
an answer without such an object, a missing key or a non-numeric value is *unparsable*, a value
outside [0, 1] is *out of range*; neither becomes a regime (the evaluation counts them as wrong).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Literal

from reward_server.backends.base import GenerationRequest
from reward_server.domain import Regime
from reward_server.nli.verifier import regime_of

JUDGE_TEMPLATE_VERSION = "nlicv-judge-v1"

JUDGE_SYSTEM = (
    "You are a strict evaluator of personalized answers. You check two constraints "
    "independently. Correct: the response states the correct answer given below (whatever else "
    "it says). Aligned: the response is framed around the user's preference given below (whether "
    "or not the answer is correct). Never let one constraint influence the other."
)

JUDGE_USER = """## Response
{response}

## Correct answer
{answer}

## User preference
{preference}

Rate each constraint with a number between 0 (certainly not satisfied) and 1 (certainly satisfied).
Answer with this JSON object and nothing else:
{{"correct": <number>, "aligned": <number>}}"""

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_KEYS = ("correct", "aligned")

Status = Literal["ok", "out_of_range", "unparsable"]


@dataclass(frozen=True)
class JudgeVerdict:
    """A parsed answer; the scores are set iff ``status == "ok"``."""

    s_correct: float | None
    s_aligned: float | None
    status: Status
    answer: str = ""  # the judge's raw answer

    def regime(self, tau: float) -> Regime | None:
        if self.s_correct is None or self.s_aligned is None:
            return None
        return regime_of(self.s_correct, self.s_aligned, tau)


def judge_request(
    *, response: str, answer: str, preference: str, max_new_tokens: int = 48
) -> GenerationRequest:
    """The judge's prompt for one item (greedy decoding)."""
    user = JUDGE_USER.format(
        response=response.strip() or "(empty)",
        answer=answer.strip() or "(none)",
        preference=preference.strip() or "(none)",
    )
    return GenerationRequest(
        system=JUDGE_SYSTEM, user=user, max_new_tokens=max_new_tokens, temperature=0.0, top_p=1.0
    )


def _last_object(text: str) -> dict[str, Any] | None:
    decoder = json.JSONDecoder()
    for start in range(len(text) - 1, -1, -1):
        if text[start] != "{":
            continue
        try:
            obj, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return obj
    return None


def _value(x: Any) -> float | None:
    if isinstance(x, bool):
        return 1.0 if x else 0.0
    if isinstance(x, int | float) and math.isfinite(x):
        return float(x)
    return None


def parse_judge_answer(answer: str) -> JudgeVerdict:
    """Strict parse of the judge's answer (see module doc)."""
    obj = _last_object(_THINK.sub("", answer))
    if obj is None:
        return JudgeVerdict(None, None, "unparsable", answer)
    lowered = {str(k).strip().lower(): v for k, v in obj.items()}
    values = [_value(lowered.get(k)) for k in _KEYS]
    sc, sa = values
    if sc is None or sa is None:
        return JudgeVerdict(None, None, "unparsable", answer)
    if not (0.0 <= sc <= 1.0 and 0.0 <= sa <= 1.0):
        return JudgeVerdict(None, None, "out_of_range", answer)
    return JudgeVerdict(sc, sa, "ok", answer)
