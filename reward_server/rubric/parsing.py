"""Parsing the rubric generator's raw output (docs/parl.md §1, §3).

Accepted shape: a bare JSON array of objects with a string ``rule`` (extra keys are ignored).
What happens before ``json.loads`` is ``RubricSettings.parser`` (default: the template's own):

- ``released`` (PARL's reward, parl_rm_a.py): its ``postprocess`` applied TWICE, as
  ``compute_rubrics_score`` does (once over the batch, once per sample). One pass cuts after the
  FIRST ``</think>``, then after the first ``[Review]:``, ``[Review Text]:``, ``[Headline]:`` and
  ``[Content]:`` (in that order, stripping each time); the second pass does it again, so an
  output with two ``</think>`` blocks is read after the second. A code fence is not removed
  (json.loads fails, reward 0.0). Rules are kept as written and their length is measured as
  written. A rule that is a JSON array or object is measured as the released code measures it,
  by ``len()`` (elements or keys): outside the length bounds it is skipped; inside them it is
  judged as Python's ``str()`` of it, as the released prompt's ``format`` inserts it. At
  inference (rubric induction, generate-rubrics-a.py: no length filter) every rule value is
  kept, a non-string one (null included) as its ``str()``, blank ones too.
- ``released-v1`` (this project's released parser before issue 52): ``postprocess`` once, and a
  rule that is not a string rejects the whole output; blank rules dropped at inference.
- ``lenient`` (ours, templates parl-v1/v2): drop everything through the LAST ``</think>`` and
  tolerate ONE surrounding Markdown code fence (```` ``` ```` or ```` ```json ````); rules are
  stripped and measured after the strip.

Nothing else is repaired.

Training mode (PARL reward) applies the gates of §1.3: the array must hold between
``min_rules`` and ``max_rules`` elements, and rules shorter than ``min_rule_chars`` or longer
than ``max_rule_chars`` are skipped (not fatal). In training, a rule that is null, a number or a
boolean rejects the output in every parser (the released reward rejects null; ``len()`` of a
number raises there). Inference mode (rubric induction) has no length filter and no cap.
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
    """PARL's ``postprocess``: cut after the first ``</think>`` and each marker, verbatim (one
    pass; the released reward applies it twice, the generate-rubrics and eval-test scripts once)."""
    text = raw
    for marker in (THINK_END, *RELEASED_MARKERS):
        idx = text.find(marker)
        if idx != -1:
            text = text[idx + len(marker) :].strip()
    return text


def _body(raw: str, parser: str) -> str:
    if parser == "lenient":
        return strip_wrapping(raw)
    if parser == "released":  # compute_rubrics_score: postprocess over the batch, then per sample
        return released_postprocess(released_postprocess(raw))
    return released_postprocess(raw)


def _released_rule(value: object) -> tuple[str, int] | None:
    """(the text the released code judges, the length it measures) for a rule value, None when
    it rejects the output: a string as written; a list or object as Python's ``str()`` of it,
    measured by ``len()`` (its elements or keys)."""
    if isinstance(value, str):
        return value, len(value)
    if isinstance(value, list | dict):
        return str(value), len(value)
    return None


def _reject(reason: str, n_parsed: int = 0) -> ParsedRubric:
    return ParsedRubric(rules=(), n_parsed=n_parsed, invalid_reason=reason)


def parse_rubric_output(raw: str, settings: RubricSettings, *, mode: Mode) -> ParsedRubric:
    """Parse a generator output into rules (see module doc for the gates)."""
    parser = settings.parser_in_use
    lenient = parser == "lenient"
    body = _body(raw, parser)
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
        value = element["rule"]
        if parser != "released":
            got = (value, len(value)) if isinstance(value, str) else None
        elif mode == "inference":  # generate-rubrics: rubric['rule'] inserted by format(), judged
            got = (value if isinstance(value, str) else str(value), 0)
        else:
            got = _released_rule(value)
        if got is None:
            return _reject(f'element {i}: "rule" is {_json_kind(value)}, expected a string', n)
        rule, length = got
        if lenient:
            rule = rule.strip()
            length = len(rule)
        if mode == "training":
            if settings.min_rule_chars <= length <= settings.max_rule_chars:
                rules.append(rule)
        elif parser == "released" or rule.strip():
            rules.append(rule)
    return ParsedRubric(rules=tuple(rules), n_parsed=n)


def _json_kind(value: object) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", list: "an array", dict: "an object"}
    return "null" if value is None else names.get(type(value), f"a {type(value).__name__}")
