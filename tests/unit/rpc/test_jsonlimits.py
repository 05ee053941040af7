"""The JSON pre-scan: depth and value counts decided before parsing, strings ignored."""

from __future__ import annotations

import pytest

from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server.errors import InvalidRequest
from reward_server.rpc import jsonlimits


def _check(text: str, depth: int = 4, values: int = 100) -> None:
    jsonlimits.check(text, max_depth=depth, max_values=values, what="the body")


def test_depth_at_the_limit_passes_and_one_more_is_refused() -> None:
    _check("[[[[1]]]]")
    with pytest.raises(InvalidRequest, match="nested deeper than 4"):
        _check("[[[[[1]]]]]")
    _check('{"a": {"b": [{"c": 1}]}}')
    with pytest.raises(InvalidRequest, match="nested deeper than 4"):
        _check('{"a": {"b": [{"c": [1]}]}}')


def test_brackets_and_commas_inside_strings_do_not_count() -> None:
    _check('{"a": "[[[[[[[[,,,,:::{{{{"}', depth=2, values=4)
    _check('["a\\"[[[[[[", "b"]', depth=1, values=3)


def test_values_at_the_limit_pass_and_one_more_is_refused() -> None:
    _check("[" + ",".join(["1"] * 9) + "]", values=10)  # 1 + one per '[' and ','
    with pytest.raises(InvalidRequest, match="more than 10 JSON values"):
        _check("[" + ",".join(["1"] * 10) + "]", values=10)
    with pytest.raises(InvalidRequest, match="more than 3 JSON values"):
        _check('["a", "b", "c", "d"]', values=3)  # refused on its strings alone


def test_unbalanced_text_is_left_to_the_parser() -> None:
    with pytest.raises(InvalidRequest, match="not a JSON document"):
        jsonlimits.loads("[[1]", max_depth=4, max_values=100, what="the body")
    with pytest.raises(InvalidRequest, match="nested too deeply"):
        jsonlimits.loads("[" * 100_000, max_depth=4, max_values=1_000_000, what="the body")


def test_booleans_are_refused_where_numbers_are_expected() -> None:
    ok = {"items": [{"weighted": {"parts": [{"weight": 0.5}]}}]}
    jsonlimits.refuse_booleans(pb.ScoreRequest.DESCRIPTOR, ok, "body")
    bad = {"items": [{"weighted": {"parts": [{"weight": 0.5}, {"weight": False}]}}]}
    with pytest.raises(InvalidRequest, match=r"body\.items\[0\]\.weighted\.parts\[1\]\.weight"):
        jsonlimits.refuse_booleans(pb.ScoreRequest.DESCRIPTOR, bad, "body")
    with pytest.raises(InvalidRequest, match="numSamples"):
        jsonlimits.refuse_booleans(pb.InduceRubricsRequest.DESCRIPTOR, {"numSamples": True}, "body")
    jsonlimits.refuse_booleans(pb.VerifyRequest.DESCRIPTOR, {"evidence": True}, "body")  # a bool


# ------------------------------------------------------------ windows and pieces
def _documents() -> list[bytes]:
    """JSON texts with strings that hold escaped quotes, backslashes, brackets and non-ASCII
    characters, numbers with exponents, and nested arrays, as the three json.dumps styles."""
    import json
    import random

    rng = random.Random(7)
    leaves = [1, -2.5e10, 1.5e-3, 12345678901234567890, "a\\\"b,:[{", "é中\"x", True, None, "",
              "\\", "\\\\", float("nan")]

    def value(depth: int = 0) -> object:
        r = rng.random()
        if depth > 4 or r < 0.3:
            return rng.choice(leaves)
        if r < 0.6:
            return [value(depth + 1) for _ in range(rng.randint(0, 5))]
        return {f"k{rng.randint(0, 9)}é": value(depth + 1) for _ in range(rng.randint(0, 5))}

    out = []
    for k in range(100):
        doc = ({"items": [value() for _ in range(rng.randint(0, 20))], "x": value()}
               if k % 3 else value())
        out += [json.dumps(doc).encode(), json.dumps(doc, ensure_ascii=False).encode(),
                json.dumps(doc, indent=1).encode()]
    return out


@pytest.mark.parametrize("window", [1, 2, 3, 7, 64])
def test_windowed_scan_and_piecewise_decoding_read_what_json_loads_reads(
    monkeypatch: pytest.MonkeyPatch, window: int
) -> None:
    """Windows of any size (cutting strings, escapes, characters and numbers anywhere) give
    json.loads's document, and the same counts as one scan of the whole text."""
    import json
    import math

    monkeypatch.setattr(jsonlimits, "WINDOW", window)
    for raw in _documents():
        got = jsonlimits.loads(raw, max_depth=32, max_values=10**6, what="the body")
        want = json.loads(raw)
        assert json.dumps(got) == json.dumps(want) or (
            isinstance(want, float) and math.isnan(want))
        assert jsonlimits.loads(bytearray(raw), max_depth=32, max_values=10**6,
                                what="the body") is not None or want is None
        skeleton = jsonlimits._STRING.sub(b'""', raw)
        values = 1 + sum(skeleton.count(c) for c in (b"[", b"{", b",", b":"))
        if raw.count(b'"') // 2 < values - 1:
            with pytest.raises(InvalidRequest, match="more than"):
                jsonlimits.check(raw, max_depth=32, max_values=values - 1, what="the body")
        jsonlimits.check(raw, max_depth=32, max_values=values, what="the body")


@pytest.mark.parametrize("bad", [b'{"a": [1, 2,]}', b'{"a": 1,}', b'{"a" 1}', b'{"a": [1 2]}',
                                 b'{"a": 1} x', b'{"a": "\xff"}', b'{"a": tru}', b'{"a": 12',
                                 b'{"a": "abc', b'{1: 2}'])
def test_text_that_is_not_json_is_refused_piecewise_too(
    monkeypatch: pytest.MonkeyPatch, bad: bytes
) -> None:
    monkeypatch.setattr(jsonlimits, "WINDOW", 2)
    with pytest.raises(InvalidRequest, match="not a JSON document"):
        jsonlimits.loads(bad, max_depth=32, max_values=100, what="the body")


def test_one_element_larger_than_a_piece_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonlimits, "WINDOW", 16)
    monkeypatch.setattr(jsonlimits, "MAX_PIECE_BYTES", 256)
    ok = b'{"items": ["' + b"x" * 200 + b'"]}'
    assert jsonlimits.loads(ok, max_depth=4, max_values=100, what="the body") == {
        "items": ["x" * 200]}
    with pytest.raises(InvalidRequest, match="more than 256 bytes"):
        jsonlimits.loads(b'{"items": ["' + b"x" * 300 + b'"]}', max_depth=4, max_values=100,
                         what="the body")


def test_a_label_of_escaped_quotes_cut_by_windows_is_scanned_in_linear_time() -> None:
    """50,000 escaped quotes in one string (an OpenRLHF label nested 50,000 deep, as JSON
    text): strings are never matched from an escaped quote, so a window that cuts the string
    is not retried at each of them (that took tens of seconds)."""
    import json

    body = json.dumps({"labels": ['{"a":' * 50_000 + "1" + "}" * 50_000]}).encode()
    data = jsonlimits.loads(body, max_depth=32, max_values=500_000, what="the body")
    with pytest.raises(InvalidRequest, match="nested deeper than 32"):
        jsonlimits.check(data["labels"][0], max_depth=32, max_values=500_000, what="the label")
