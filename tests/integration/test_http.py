"""The HTTP/JSON door of a real server (fake engines): the same answers as gRPC, the error
table's HTTP statuses, the JSON convention, OpenRLHF's remote reward requests, and spans."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from reward_server import domain as d
from reward_server.api.rows import fill_response, read_row
from reward_server.backends.fake import FakeJudge
from reward_server.errors import BackendUnavailable
from trainer.data.prepare import main as prepare

from .conftest import Running, running_server

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
RULES = ('The text mentions "coffee".', 'The text mentions "tea".')


def _base(r: Running) -> str:
    assert r.app.http_port is not None
    return f"http://127.0.0.1:{r.app.http_port}"


async def _request(method: str, url: str, body: Any = None,
                   headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
    async with aiohttp.ClientSession() as s, s.request(method, url, json=body,
                                                       headers=headers) as resp:
        return resp.status, dict(resp.headers), await resp.json(content_type=None)


async def openrlhf_fetch_rewards(endpoints: Sequence[str], queries: list[str],
                                 prompts: list[str], labels: list[Any]) -> list[Any]:
    """The requests OpenRLHF's remote reward client makes, as it makes them
    (openrlhf/utils/agent.py, SingleTurnAgentExecutor._fetch_rewards_via_http, OpenRLHF
    3c3be62), without its five retries so that a failure fails the test."""
    num_servers = len(endpoints)
    batch_size = (len(queries) + num_servers - 1) // num_servers
    timeout = aiohttp.ClientTimeout(total=180)

    async def post(url: str, data: dict[str, Any]) -> Any:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.post(url, json=data) as response:
                response.raise_for_status()
                return await response.json()

    tasks = []
    for i, rm in enumerate(endpoints):
        start, end = i * batch_size, min((i + 1) * batch_size, len(queries))
        payload = {"query": queries[start:end], "prompts": prompts[start:end],
                   "labels": labels[start:end]}
        tasks.append(asyncio.create_task(post(rm, payload)))
    return list(await asyncio.gather(*tasks))


@pytest_asyncio.fixture(scope="module")
async def server() -> AsyncIterator[Running]:
    async with running_server(["server.http.port=0", f"server.auth_token={TOKEN}",
                               "service.limits.max_batch_items=8"]) as r:
        yield r


@pytest.fixture(scope="module")
def openrlhf_rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Rows of `prepare --format openrlhf` for both tasks (the shipped sample)."""
    rows = []
    for task in ("rubric_generator", "personalized_generator"):
        out = tmp_path_factory.mktemp(task)
        assert prepare(["--sample", "--task", task, "--format", "openrlhf", "--val-size", "1",
                        "--out", str(out)]) == 0
        assert not (out / "train.parquet").exists()  # only the format asked for
        lines = (out / "openrlhf_train.jsonl").read_text(encoding="utf-8").splitlines()
        rows += [json.loads(line) for line in lines[:2]]
    return rows


def _chatml(messages: list[dict[str, str]]) -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages) + \
        "<|im_start|>assistant\n"


async def _grpc_rewards(r: Running, labels: list[str], responses: list[str]) -> list[float]:
    """gRPC Score of the same items, built from the labels' templates by the client path."""
    from google.protobuf import json_format

    from reward_server._proto.reward.v1 import reward_pb2 as pb
    from reward_server.api.convert import item_from_proto

    items = []
    for i, (label, response) in enumerate(zip(labels, responses, strict=True)):
        msg = fill_response(json_format.Parse(label, pb.ScoreItem()), response, where="test")
        msg.id = f"s{i}"  # both tasks' rows name the same users
        items.append(item_from_proto(msg, i))
    async with r.client(token=TOKEN) as c:
        return [res.reward for res in await c.score(items)]  # type: ignore[misc]


RESPONSES = [  # two rubric_generator rows (rule lists), two personalized_generator rows
    json.dumps([{"rule": 'The review opens with the word "Honestly".'},
                {"rule": 'The review mentions "my kids" using the product.'}]),
    json.dumps([{"rule": 'The headline is about "tea" and nothing else.'},
                {"rule": 'The headline ends with the word "stars".'}]),
    "Honestly, my kids love it. Five stars from me!", "A headline about tea"]


async def test_openrlhf_requests_get_the_grpc_rewards(
    server: Running, openrlhf_rows: list[dict[str, Any]]
) -> None:
    url = f"{_base(server)}/openrlhf/reward"
    auth_url = url.replace("http://", f"http://openrlhf:{TOKEN}@")  # how OpenRLHF can auth
    responses = RESPONSES[: len(openrlhf_rows)]
    got = []
    for row, response in zip(openrlhf_rows, responses, strict=True):
        prompt = _chatml(row["input"])  # --data.apply_chat_template
        query = prompt + response + "<|im_end|>"  # decoded with skip_special_tokens=False
        # one sample per request, as OpenRLHF sends; a second server gets the empty rest
        answers = await openrlhf_fetch_rewards([auth_url, auth_url], [query], [prompt],
                                               [row["label"]])
        assert answers[1] == {"rewards": [], "scores": [], "extra_logs": {}}
        info = answers[0]
        assert set(info) == {"rewards", "scores", "extra_logs"}
        assert len(info["rewards"]) == 1 and info["scores"] == info["rewards"]
        assert all(len(v) == 1 for v in info["extra_logs"].values())
        assert info["extra_logs"]["policy_invalid"] == [0.0]
        got.append(info["rewards"][0])
    expected = await _grpc_rewards(server, [r["label"] for r in openrlhf_rows], responses)
    assert got == pytest.approx(expected)
    assert len(set(got)) > 1  # the responses matter


async def test_openrlhf_with_a_real_chat_template(server: Running, smollm2_path: str,
                                                  openrlhf_rows: list[dict[str, Any]]) -> None:
    """Prompt and query made as OpenRLHF makes them with a real tokenizer: chat template,
    tokenized without special tokens, the generated ids appended, decoded with them."""
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_path)
    row, response = openrlhf_rows[-1], RESPONSES[len(openrlhf_rows) - 1]
    prompt = tok.apply_chat_template(row["input"], tokenize=False, add_generation_prompt=True)
    prompt_ids = tok(text=prompt, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    action_ids = tok(text=response, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    query = tok.decode(prompt_ids.tolist() + action_ids, skip_special_tokens=False)
    assert query.endswith(tok.eos_token)
    url = f"{_base(server)}/openrlhf/reward".replace("http://", f"http://u:{TOKEN}@")
    [info] = await openrlhf_fetch_rewards([url], [query], [prompt], [row["label"]])
    assert info["rewards"] == pytest.approx(await _grpc_rewards(server, [row["label"]], [response]))
    # what OpenRLHF's samples generator then does with the answer
    reward = torch.tensor([info["rewards"]])
    logs = {k: torch.tensor([v]) for k, v in info["extra_logs"].items()}
    assert reward.numel() == 1 and all(t.numel() == 1 for t in logs.values())


async def test_openrlhf_bad_label_is_400_naming_the_sample(server: Running) -> None:
    url = f"{_base(server)}/openrlhf/reward"
    good = json.dumps({"rubric_score": {"rules": list(RULES)}})
    for label, says in [("", "label is empty"), ("{not json", "not JSON"),
                        (json.dumps({"nope": 1}), "no field 'nope'"),
                        (json.dumps({"id": "x"}), "sets no reward kind"),
                        (json.dumps({"rubric_score": {"text": "t", "rules": ["r"]}}),
                         "rubric_score.text is set")]:
        status, _, body = await _request("POST", url, {"query": ["p r", "p r"], "prompts": ["p", "p"],
                                                       "labels": [good, label]}, AUTH)
        assert status == 400, body
        assert body["error"]["status"] == "INVALID_ARGUMENT"
        assert "sample 1" in body["error"]["message"] and says in body["error"]["message"]
    status, _, body = await _request("POST", url, {"query": ["q"], "prompts": ["p"],
                                                   "labels": [good]}, AUTH)
    assert status == 400 and "does not start with its prompt" in body["error"]["message"]


async def test_openrlhf_policy_invalid_gets_the_penalty(server: Running) -> None:
    label = json.dumps({"rubric_score": {"rules": list(RULES)}})
    status, _, body = await _request(
        "POST", f"{_base(server)}/openrlhf/reward",
        {"query": ["Q: <|im_end|>"], "prompts": ["Q: "], "labels": [label]}, AUTH)  # empty
    assert status == 200, body
    penalty = server.service.settings.policy_invalid_penalty
    assert body["rewards"] == [penalty]
    assert body["extra_logs"]["policy_invalid"] == [1.0]


async def test_score_over_http_equals_grpc_and_uses_proto_names(server: Running) -> None:
    items = [{"id": "a", "rubric_score": {"context": "c", "text": "I drink coffee",
                                          "rules": list(RULES)}},
             {"id": "b", "nliConstraints": {"response": "r", "answer": "a",  # camelCase in
                                            "preference": "p"}}]
    status, _, body = await _request("POST", f"{_base(server)}/v1/score", {"items": items}, AUTH)
    assert status == 200, body
    results = body["results"]
    assert [r["id"] for r in results] == ["a", "b"]
    assert all("timings_ms" in r and "timingsMs" not in r for r in results)  # proto names out
    assert all("message" in r for r in results)  # defaults printed
    async with server.client(token=TOKEN) as c:
        grpc_results = await c.score([
            d.ScoreItem("a", d.RubricScoreSpec("c", "I drink coffee", RULES)),
            d.ScoreItem("b", d.NliConstraintsSpec(response="r", answer="a", preference="p")),
        ])
    assert [r["reward"] for r in results] == pytest.approx([r.reward for r in grpc_results])
    assert results[0]["components"] == pytest.approx(dict(grpc_results[0].components))


async def test_info_verify_health(server: Running) -> None:
    status, _, info = await _request("GET", f"{_base(server)}/v1/info", headers=AUTH)
    assert status == 200 and info["api_version"] == "reward.v1" and info["fake_engines"] is True
    status, _, v = await _request("POST", f"{_base(server)}/v1/verify",
                                  {"response": "Paris", "answer": "Paris",
                                   "preference": "short"}, AUTH)
    assert status == 200 and {"s_correct", "s_aligned", "regime"} <= set(v)
    status, _, health = await _request("GET", f"{_base(server)}/v1/health")  # open, as gRPC's
    assert (status, health) == (200, {"status": "SERVING", "down": {}})


async def test_auth_is_the_grpc_token(server: Running) -> None:
    url = f"{_base(server)}/v1/info"
    for headers, says in [(None, "missing"), ({"Authorization": "Bearer nope"}, "wrong")]:
        status, h, body = await _request("GET", url, headers=headers)
        assert status == 401 and body["error"]["status"] == "UNAUTHENTICATED"
        assert says in body["error"]["message"] and h["WWW-Authenticate"].startswith("Bearer")
    async with aiohttp.ClientSession() as s, s.get(url, auth=aiohttp.BasicAuth("x", TOKEN)) as resp:
        assert resp.status == 200


async def test_invalid_bodies_are_400(server: Running) -> None:
    url = f"{_base(server)}/v1/score"
    for body, says in [({"items": []}, "batch is empty"), ({"itemz": []}, "no field 'itemz'"),
                       ({"items": [{"id": "a", "rubric_score": {"text": "t"}}]}, "rules")]:
        status, _, reply = await _request("POST", url, body, AUTH)
        assert status == 400 and reply["error"]["status"] == "INVALID_ARGUMENT", reply
        assert says in reply["error"]["message"]
    async with aiohttp.ClientSession() as s, s.post(
            url, data=b"{oops", headers={**AUTH, "Content-Type": "application/json"}) as resp:
        assert resp.status == 400 and "not a JSON" in (await resp.json())["error"]["message"]


async def test_load_shed_is_429_with_retry_after() -> None:
    async with running_server(["server.http.port=0", "service.admission.max_waiting=0",
                               "service.admission.max_judgments_in_flight=1"],
                              judge=FakeJudge(latency_s=1.0)) as r:
        one = {"items": [{"id": "a", "rubric_score": {"text": "coffee", "rules": [RULES[0]]}}]}
        slow = asyncio.create_task(_request("POST", f"{_base(r)}/v1/score", one))
        for _ in range(500):  # until the first call holds the one judgment
            if r.service.admission.judgments:
                break
            await asyncio.sleep(0.01)
        status, headers, body = await _request("POST", f"{_base(r)}/v1/score", one)
        assert status == 429 and body["error"]["status"] == "RESOURCE_EXHAUSTED", body
        assert int(headers["Retry-After"]) >= 1
        assert (await slow)[0] == 200


async def test_engine_down_is_503_and_a_bug_is_500() -> None:
    judge = FakeJudge()
    async with running_server(["server.http.port=0", "server.health_poll_s=0.05"],
                              judge=judge) as r:
        one = {"items": [{"id": "a", "rubric_score": {"text": "coffee", "rules": [RULES[0]]}}]}
        judge.fail_with = BackendUnavailable("every judge replica is gone")
        status, _, body = await _request("POST", f"{_base(r)}/v1/score", one)
        assert status == 503 and body["error"]["status"] == "UNAVAILABLE"
        assert "replica is gone" in body["error"]["message"]
        for _ in range(100):  # the same health as gRPC's
            status, _, health = await _request("GET", f"{_base(r)}/v1/health")
            if status == 503:
                break
            await asyncio.sleep(0.05)
        assert status == 503 and health["status"] == "NOT_SERVING" and "judge" in health["down"]
        judge.fail_with = KeyError("a bug")
        status, _, body = await _request("POST", f"{_base(r)}/v1/score", one)
        assert status == 500 and body["error"]["status"] == "INTERNAL"
        assert "see the server log" in body["error"]["message"]


async def test_draining_answers_503_and_closes_the_door() -> None:
    async with running_server(["server.http.port=0"]) as r:
        url = f"{_base(r)}/v1/info"
        r.app.server.servicer.stop_accepting()
        status, _, body = await _request("GET", url)
        assert status == 503 and "draining" in body["error"]["message"]
    with pytest.raises(aiohttp.ClientConnectionError):  # stopped with the app
        await _request("GET", url)


async def test_busy_http_port_is_a_config_error() -> None:
    from reward_server.errors import ConfigError

    async with running_server(["server.http.port=0"]) as r:
        with pytest.raises(ConfigError, match=r"server\.http\.port"):
            async with running_server([f"server.http.port={r.app.http_port}"]):
                pass


def test_prepare_openrlhf_labels_are_the_extra_info_items(tmp_path: Path) -> None:
    """The OpenRLHF route builds from a label the same item the TRL/verl path builds from
    extra_info, through the same fill_response."""
    from reward_server.api.convert import item_from_proto
    from reward_server.rpc import openrlhf
    from trainer.data.prepare import build_rows, sample_records, to_openrlhf

    rows = build_rows(sample_records(history_limit=2), "personalized_generator", history_limit=2)
    for row, out in zip(rows, to_openrlhf(rows), strict=True):
        assert out["input"] == row["prompt"] and out["datasource"] == row["data_source"]
        request = openrlhf.score_request(
            {"query": ["P: a reply"], "prompts": ["P:"], "labels": [out["label"]]}, end_markers=())
        via_label = item_from_proto(request.items[0], 0)
        via_row = read_row(row["extra_info"]).item("a reply", item_id=via_label.item_id)
        assert via_label == via_row
    assert len(rows) == len(sample_records())


async def test_a_large_body_is_parsed_off_the_loop_with_the_same_answer(server: Running) -> None:
    from reward_server.rpc.http import PARSE_INLINE_BYTES

    items = [{"id": f"i{i}", "rubric_score": {"context": "c " * 10_000, "text": f"coffee {i} " * 2_000,
                                              "rules": [RULES[0]]}} for i in range(8)]
    body = {"items": items}
    assert len(json.dumps(body)) > PARSE_INLINE_BYTES
    status, _, reply = await _request("POST", f"{_base(server)}/v1/score", body, AUTH)
    assert status == 200, reply
    assert [r["id"] for r in reply["results"]] == [f"i{i}" for i in range(8)]
    assert all(r["status"] == "ITEM_STATUS_OK" for r in reply["results"])


async def test_unknown_route_and_method_answer_the_json_error_envelope(server: Running) -> None:
    status, _, body = await _request("GET", f"{_base(server)}/v1/nope")
    assert status == 404 and body["error"]["status"] == "NOT_FOUND", body
    assert "/v1/score" in body["error"]["message"]  # the routes there are
    status, headers, body = await _request("DELETE", f"{_base(server)}/v1/score", None, AUTH)
    assert status == 405 and body["error"]["status"] == "UNIMPLEMENTED", body
    assert headers.get("Allow") == "POST" and "use POST" in body["error"]["message"]


async def test_a_misspelt_field_lists_the_fields_by_their_proto_names(server: Running) -> None:
    body = {"items": [{"id": "a", "parl_reward": {"policy_outptu": "x"}}]}
    status, _, reply = await _request("POST", f"{_base(server)}/v1/score", body, AUTH)
    message = reply["error"]["message"]
    assert status == 400 and "policy_output" in message and "policyOutput" not in message, message
    assert "\n" not in message
