"""The HTTP side of the one error table, the JSON convention, the token check, and the
OpenRLHF protocol's pure parts (response extraction, labels, the answer)."""

from __future__ import annotations

import base64
import json
import math

import grpc
import pytest

from reward_server import errors
from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server.api import jsonmap
from reward_server.rpc import openrlhf
from reward_server.rpc.auth import TokenCheck
from reward_server.rpc.settings import OPENRLHF_END_MARKERS
from reward_server.rpc.status import HTTP_STATUS, http_headers_for, http_status_for


def test_every_grpc_code_has_an_http_status() -> None:
    assert set(HTTP_STATUS) == set(grpc.StatusCode)


@pytest.mark.parametrize(("exc", "status"), [
    (errors.InvalidRequest("x"), 400), (errors.ConfigError("x"), 400),
    (errors.Unauthenticated("x"), 401), (errors.Overloaded("x"), 429),
    (errors.BackendUnavailable("x"), 503), (ConnectionResetError(), 503),
    (errors.DeadlineExceeded("x"), 504), (errors.EngineError("x"), 500), (KeyError("bug"), 500),
])
def test_http_status_follows_the_grpc_code(exc: BaseException, status: int) -> None:
    assert http_status_for(exc) == status


def test_retry_after_and_www_authenticate() -> None:
    assert http_headers_for(errors.Overloaded("x", retry_after_s=0.2)) == {"Retry-After": "1"}
    assert http_headers_for(errors.Overloaded("x", retry_after_s=2.5)) == {"Retry-After": "3"}
    assert http_headers_for(errors.Overloaded("x")) == {}
    assert "WWW-Authenticate" in http_headers_for(errors.Unauthenticated("x"))


def test_json_uses_proto_names_prints_defaults_and_reads_both() -> None:
    out = jsonmap.to_dict(pb.ItemResult(id="a", reward=0.0, timings_ms={"total": 1.0}))
    assert out["timings_ms"] == {"total": 1.0} and "timingsMs" not in out
    assert out["reward"] == 0.0 and out["message"] == ""  # a zero reward is written
    camel = jsonmap.parse(pb.ItemResult, '{"id": "a", "timingsMs": {"t": 2}}')
    snake = jsonmap.parse(pb.ItemResult, '{"id": "a", "timings_ms": {"t": 2}}')
    assert camel == snake
    with pytest.raises(errors.InvalidRequest, match=r"reward\.v1\.ItemResult"):
        jsonmap.parse(pb.ItemResult, '{"idd": 1}')


def test_token_check() -> None:
    check = TokenCheck("tok")
    assert check.problem(b"Bearer tok") is None
    assert check.problem(b"") is not None and "missing" in check.problem(b"")  # type: ignore[operator]
    assert check.problem(b"Bearer nope") == "wrong bearer token"
    basic = b"Basic " + base64.b64encode(b"openrlhf:tok")
    assert check.problem(basic) is not None  # gRPC: bearer only
    assert check.problem(basic, basic=True) is None
    assert check.problem(b"Basic " + base64.b64encode(b"u:no"), basic=True) is not None
    assert check.problem(b"Basic !!!", basic=True) is not None


@pytest.mark.parametrize(("query", "prompt", "response"), [
    ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>",
     "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "Hello!"),
    ("User: hi\nAssistant: Hello!</s>", "User: hi\nAssistant:", "Hello!"),
    ("User:  hi \n\nAssistant: Hello!<|eot_id|><|end_of_text|>", "User: hi\nAssistant:", "Hello!"),
    ("p r <eos>", "p", "r"),
])
def test_response_text(query: str, prompt: str, response: str) -> None:
    assert openrlhf.response_text(query, prompt, OPENRLHF_END_MARKERS, where="sample 0") == response


def test_response_text_needs_the_prompt_prefix() -> None:
    with pytest.raises(errors.InvalidRequest, match="sample 3: the query does not start"):
        openrlhf.response_text("xyz", "abc", (), where="sample 3")


def test_weighted_template_gets_the_response_in_every_part() -> None:
    label = json.dumps({"weighted": {"parts": [
        {"weight": 1, "rubric_score": {"rules": ["r"]}},
        {"weight": 1, "nli_constraints": {"answer": "a", "preference": "p"}}]}})
    request = openrlhf.score_request(
        {"query": ["P: the reply"], "prompts": ["P:"], "labels": [label]}, end_markers=())
    [item] = request.items
    assert item.id == "sample0"
    assert [item.weighted.parts[0].rubric_score.text,
            item.weighted.parts[1].nli_constraints.response] == ["the reply", "the reply"]


@pytest.mark.parametrize(("payload", "says"), [
    ([], "not a JSON object"), ({"query": [], "prompts": []}, "no list ['labels']"),
    ({"query": ["a"], "prompts": [], "labels": []}, "1, 0 and 0 entries"),
    ({"query": [1], "prompts": ["p"], "labels": ["{}"]}, "sample 0: query and prompt"),
])
def test_malformed_bodies(payload: object, says: str) -> None:
    with pytest.raises(errors.InvalidRequest, match=says.replace("[", r"\[").replace("]", r"\]")):
        openrlhf.score_request(payload, end_markers=())


def test_reply_has_the_kinds_fixed_components_and_a_mask_for_missing() -> None:
    request = openrlhf.score_request(
        {"query": ["p a", "p b"], "prompts": ["p", "p"],
         "labels": [json.dumps({"rubric_score": {"rules": ["r"]}}),
                    {"nli_constraints": {"answer": "a", "preference": "b"}}]}, end_markers=())
    response = pb.ScoreResponse(results=[
        pb.ItemResult(id="sample0", status=pb.ITEM_STATUS_OK, reward=0.7,
                      components={"mean_p_yes": 0.7, "p_yes.0": 0.7}),
        pb.ItemResult(id="sample1", status=pb.ITEM_STATUS_POLICY_INVALID, reward=-1.0),
    ])
    out = openrlhf.reply(request, response)
    assert out["rewards"] == out["scores"] == [0.7, -1.0]
    logs = out["extra_logs"]
    assert "p_yes.0" not in logs  # indexed families vary per item: not logged
    # a component an item did not compute: 0.0 with its mask 0.0, never NaN
    assert logs["mean_p_yes"] == [0.7, 0.0] and logs["mean_p_yes_mask"] == [1.0, 0.0]
    assert logs["s_correct"] == [0.0, 0.0] and logs["s_correct_mask"] == [0.0, 0.0]
    assert logs["policy_invalid"] == [0.0, 1.0]
    assert all(len(v) == 2 and all(math.isfinite(x) for x in v) for v in logs.values())


def test_a_score_request_serialized_item_by_item_is_the_same_bytes() -> None:
    from reward_server.rpc.http import serialized

    for n in (0, 1, 3, 130):
        request = pb.ScoreRequest(items=[pb.ScoreItem(id=f"i{k}" * (k % 50), rubric_score=pb.RubricScore(
            text="t" * (k * 997 % 40_000), rules=["r"] * (k % 70))) for k in range(n)])
        assert serialized(request) == request.SerializeToString()
    other = pb.VerifyRequest(response="c")
    assert serialized(other) == other.SerializeToString()
