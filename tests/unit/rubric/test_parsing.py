"""Golden cases for the generator-output parser (docs/parl.md §1, §3): the released parser
(PARL's postprocess twice + json.loads, the default), the released-v1 parser (postprocess once,
this project before issue 52) and our lenient one (templates parl-v1/v2)."""

from __future__ import annotations

import json

import pytest

from reward_server.rubric import RubricSettings, parse_rubric_output
from reward_server.rubric.parsing import released_postprocess, strip_wrapping

S = RubricSettings()  # parser: released (the default template's)
LENIENT = RubricSettings(parser="lenient")
V1 = RubricSettings(parser="released-v1")
R = "The review opens with a one-line verdict."
R2 = "Sentences are short and use exclamation marks."


def arr(*rules: object) -> str:
    return json.dumps([{"rule": r} for r in rules])


def test_plain_array() -> None:
    p = parse_rubric_output(arr(R, R2), S, mode="training")
    assert p.rules == (R, R2) and p.n_parsed == 2 and p.invalid_reason is None


def test_parser_follows_the_template_unless_named() -> None:
    assert S.parser_in_use == "released"
    assert RubricSettings(template_version="parl-v1").parser_in_use == "lenient"
    assert RubricSettings(template_version="parl-v2").parser_in_use == "lenient"
    assert RubricSettings(template_version="parl-v1", parser="released").parser_in_use == "released"


def test_lenient_think_block_stripped_through_last_close() -> None:
    raw = '<think>[{"rule": "bait"}]</think> more </think>\n' + arr(R, R2)
    assert parse_rubric_output(raw, LENIENT, mode="training").rules == (R, R2)


def test_released_cleans_twice_two_think_blocks() -> None:
    """compute_rubrics_score applies postprocess to the batch, then again per sample: each pass
    cuts after the first </think>, so two blocks are both cut and the rules parse (full reward
    there). released-v1 cut once: what follows the first </think> is not JSON (0.0)."""
    raw = '<think>[{"rule": "bait"}]</think> more </think>\n' + arr(R, R2)
    assert parse_rubric_output(raw, S, mode="training").rules == (R, R2)
    p = parse_rubric_output(raw, V1, mode="training")
    assert p.invalid_reason is not None and "not valid JSON" in p.invalid_reason
    for settings in (S, V1):
        assert parse_rubric_output("<think>x</think>\n" + arr(R, R2), settings, mode="training").rules == (R, R2)
    # a third block is left: two passes, two cuts
    assert parse_rubric_output("a</think>b</think>c</think>" + arr(R, R2), S, mode="training").invalid_reason


def test_released_markers_cut_as_postprocess() -> None:
    # postprocess also cuts after "[Review]:", "[Review Text]:", "[Headline]:", "[Content]:"
    assert parse_rubric_output("[Content]: " + arr(R, R2), S, mode="training").rules == (R, R2)
    assert released_postprocess("a</think> b [Headline]: c") == "c"


@pytest.mark.parametrize("fence", ["```json\n{}\n```", "```\n{}\n```", "  ```JSON\n{}```  "])
def test_one_code_fence_tolerated_by_lenient_only(fence: str) -> None:
    raw = fence.replace("{}", arr(R, R2))
    assert parse_rubric_output(raw, LENIENT, mode="training").rules == (R, R2)
    p = parse_rubric_output(raw, S, mode="training")  # released: json.loads fails, reward 0.0
    assert p.rules == () and p.invalid_reason is not None and "not valid JSON" in p.invalid_reason


def test_prose_around_array_is_not_repaired() -> None:
    p = parse_rubric_output("Here are the rules: " + arr(R, R2), S, mode="training")
    assert p.invalid_reason is not None and "not valid JSON" in p.invalid_reason
    assert strip_wrapping("```json\n[1]\n``` trailing") == "```json\n[1]\n``` trailing"


def test_extra_keys_ignored_and_whitespace_trimmed_by_lenient_only() -> None:
    raw = json.dumps([{"rule": f"  {R} ", "dimension": "style"}, {"rule": R2, "id": 2}])
    assert parse_rubric_output(raw, LENIENT, mode="training").rules == (R, R2)
    assert parse_rubric_output(raw, S, mode="training").rules == (f"  {R} ", R2)


def test_released_length_measured_as_written() -> None:
    padded = " " + "x" * 19  # 20 characters as written, 19 after a strip
    assert parse_rubric_output(arr(padded, R), S, mode="training").rules == (padded, R)
    assert parse_rubric_output(arr(padded, R), LENIENT, mode="training").rules == (R,)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (json.dumps([{"rule": R}, {"rule": None}]), 'element 1: "rule" is null'),
        (json.dumps([{"rule": R}, {"rule": 7}]), 'element 1: "rule" is a number'),
        (json.dumps([{"rule": R}, {"rule": True}]), 'element 1: "rule" is a boolean'),
        (json.dumps([{"rule": R}, 5]), "element 1 is a JSON int"),
        (json.dumps({"rules": [R, R2]}), "JSON dict, expected an array"),
        (arr(R), "holds 1 elements"),
        (arr(*[R] * 11), "holds 11 elements"),
        ("[", "not valid JSON"),
        ("<think>no answer</think>", "empty output"),
    ],
)
def test_training_rejections(raw: str, reason: str) -> None:
    for settings in (S, V1):
        p = parse_rubric_output(raw, settings, mode="training")
        assert p.rules == () and p.invalid_reason is not None and reason in p.invalid_reason


def test_released_skips_a_list_or_object_rule() -> None:
    """The released reward measures a rule with len(): a short list or object is skipped (the
    other rules score); one of 20..400 elements is judged as Python's str() of it. released-v1
    rejected the whole output."""
    for value, kind in ((["a list"], "an array"), ({"k": "an object"}, "an object")):
        raw = json.dumps([{"rule": R}, {"rule": value}, {"rule": R2}])
        p = parse_rubric_output(raw, S, mode="training")
        assert p.invalid_reason is None and p.rules == (R, R2) and p.n_parsed == 3
        rejected = parse_rubric_output(raw, V1, mode="training")
        assert rejected.rules == () and f'element 1: "rule" is {kind}' in (rejected.invalid_reason or "")
    long = [f"w{i}" for i in range(25)]
    p = parse_rubric_output(json.dumps([{"rule": R}, {"rule": long}]), S, mode="training")
    assert p.rules == (R, str(long))


def test_length_filter_bounds_inclusive() -> None:
    exactly_20 = "x" * 20
    exactly_400 = "y" * 400
    raw = arr("x" * 19, exactly_20, exactly_400, "z" * 401)
    p = parse_rubric_output(raw, S, mode="training")
    assert p.rules == (exactly_20, exactly_400) and p.n_parsed == 4 and p.n_length_ok == 2


def test_inference_mode_no_length_filter_no_cap() -> None:
    raw = arr("short", *[R] * 11, "   ")
    p = parse_rubric_output(raw, S, mode="inference")
    assert p.invalid_reason is None and p.n_parsed == 13
    assert p.rules == ("short", *[R] * 11, "   ")  # released: every rule['rule'] is judged
    assert parse_rubric_output(raw, V1, mode="inference").rules == ("short", *[R] * 11)  # blank dropped
    one = parse_rubric_output(arr(R), S, mode="inference")
    assert one.rules == (R,)
    assert parse_rubric_output("[]", S, mode="inference").rules == ()
    # generate-rubrics inserts rubric['rule'] with format(): any value is judged as its str()
    odd = parse_rubric_output(json.dumps([{"rule": None}, {"rule": ["a"]}, {"rule": 3}]), S, mode="inference")
    assert odd.rules == ("None", "['a']", "3")
    assert parse_rubric_output(json.dumps([{"rule": 3}]), V1, mode="inference").invalid_reason
