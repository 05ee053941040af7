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
