"""Parsing the rubric generator's raw output (docs/parl.md §1, §3).

Accepted shape: a bare JSON array of objects with a string ``rule`` (extra keys are ignored).
What happens before ``json.loads`` is ``RubricSettings.parser`` (default: the template's own):

- ``released`` (PARL's ``postprocess``, parl_rm_a.py): cut after the FIRST ``</think>``, then
  after the first ``[Review]:``, ``[Review Text]:``, ``[Headline]:`` and ``[Content]:`` (in that
  order, stripping each time); a code fence is not removed (json.loads fails, reward 0.0). Rules
  are kept as written and their length is measured as written.
- ``lenient`` (ours, templates parl-v1/v2): drop everything through the LAST ``</think>`` and
  tolerate ONE surrounding Markdown code fence (```` ``` ```` or ```` ```json ````); rules are
  stripped and measured after the strip.

Nothing else is repaired.

Training mode (PARL reward) applies the gates of §1.3: the array must hold between
``min_rules`` and ``max_rules`` elements, and rules shorter than ``min_rule_chars`` or longer
than ``max_rule_chars`` are skipped (not fatal). Inference mode (rubric induction) has no
length filter and no cap; only blank rules are dropped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal

from reward_server.rubric.settings import RubricSettings

THINK_END = "</think>"
RELEASED_MARKERS = ("[Review]:", "[Review Text]:", "[Headline]:", "[Content]:")
_FENCE = re.compile(r"\A```[A-Za-z0-9_-]*[ \t]*\r?\n(?P<body>.*?)\r?\n?```\Z", re.DOTALL)

Mode = Literal["training", "inference"]


@dataclass(frozen=True)
class ParsedRubric:
    """The outcome of parsing one output.

    ``invalid_reason`` is set when the output is rejected whole (then ``rules`` is empty);
    ``n_parsed`` counts array elements, ``rules`` holds the rules that passed the length filter.
    """

    rules: tuple[str, ...]
    n_parsed: int
    invalid_reason: str | None = None

    @property
    def n_length_ok(self) -> int:
        return len(self.rules)


def strip_wrapping(raw: str) -> str:
    """Drop a reasoning block (through the last ``</think>``) and one code fence."""
    text = raw
    cut = text.rfind(THINK_END)
    if cut >= 0:
        text = text[cut + len(THINK_END) :]
    text = text.strip()
    m = _FENCE.match(text)
    if m:
        text = m.group("body").strip()
    return text


def released_postprocess(raw: str) -> str:
    """PARL's ``postprocess``: cut after the first ``</think>`` and each marker, verbatim."""
    text = raw
    for marker in (THINK_END, *RELEASED_MARKERS):
        idx = text.find(marker)
        if idx != -1:
            text = text[idx + len(marker) :].strip()
    return text


def _reject(reason: str, n_parsed: int = 0) -> ParsedRubric:
    return ParsedRubric(rules=(), n_parsed=n_parsed, invalid_reason=reason)


def parse_rubric_output(raw: str, settings: RubricSettings, *, mode: Mode) -> ParsedRubric:
    """Parse a generator output into rules (see module doc for the gates)."""
    lenient = settings.parser_in_use == "lenient"
    body = strip_wrapping(raw) if lenient else released_postprocess(raw)
    if not body.strip():
        return _reject('empty output: expected a JSON array of {"rule": ...} objects')
    try:
        data = json.loads(body)
    except json.JSONDecodeError as e:
        return _reject(f"output is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})")
    if not isinstance(data, list):
        return _reject(f"output is a JSON {type(data).__name__}, expected an array")
    n = len(data)
    if mode == "training" and not settings.min_rules <= n <= settings.max_rules:
        return _reject(
            f"array holds {n} elements, expected between {settings.min_rules} and "
            f"{settings.max_rules}",
            n,
        )
    rules: list[str] = []
    for i, element in enumerate(data):
        if not isinstance(element, dict):
            return _reject(f"element {i} is a JSON {type(element).__name__}, expected an object", n)
        if "rule" not in element:
            return _reject(f'element {i} has no "rule" key', n)
        rule = element["rule"]
        if not isinstance(rule, str):
            return _reject(f'element {i}: "rule" is a {type(rule).__name__}, expected a string', n)
        if lenient:
            rule = rule.strip()
        if mode == "training":
            if settings.min_rule_chars <= len(rule) <= settings.max_rule_chars:
                rules.append(rule)
        elif rule.strip():
            rules.append(rule)
    return ParsedRubric(rules=tuple(rules), n_parsed=n)
