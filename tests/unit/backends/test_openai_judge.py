"""OpenAIJudge against a small OpenAI-compatible HTTP server started in the test (127.0.0.1:0).

The server's "model": the first position's log-probs are yes -0.2, Yes -2.0, no -1.5 when the
user message contains "alpha"; otherwise only "no" (-0.1) and "No" (-2.5) appear in the top
list and "yes" is available only when sampling is restricted with ``allowed_token_ids``
(then the sampled token is the allowed one, log-prob -4.0).
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from reward_server.backends.base import GenerationRequest
from reward_server.backends.openai_judge import OpenAIJudge
from reward_server.domain import Task
from reward_server.errors import BackendUnavailable
from reward_server.rubric.templates import judge_prompt

VOCAB = {"yes": 1, "Yes": 2, " yes": 3, "no": 4, "No": 5, " no": 6}
NAMES = {v: k for k, v in VOCAB.items()}


class State:
    fail_next = 0  # answer 503 this many times first
    requests: ClassVar[list[dict[str, Any]]] = []
    forced_returns_nothing = False


def _top(entries: list[tuple[str, float]]) -> dict[str, Any]:
    tok, lp = entries[0]
    content = [{"token": tok, "logprob": lp, "top_logprobs": [{"token": t, "logprob": p} for t, p in entries]}]
    return {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": tok}, "logprobs": {"content": content}}]
    }


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        return None

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        State.requests.append(body)
        if self.path != "/v1/chat/completions":
            self._send(404, {"error": "not found"})
            return
        if State.fail_next > 0:
            State.fail_next -= 1
            self._send(503, {"error": "busy"})
            return
        if body.get("max_tokens", 0) > 1:  # generation
            user = body["messages"][-1]["content"]
            self._send(200, {"choices": [{"message": {"content": f"echo seed={body.get('seed')} {user[:10]}"}}]})
            return
        allowed = body.get("allowed_token_ids")
        if allowed:
            if State.forced_returns_nothing:
                self._send(200, _top([("maybe", -0.1)]))
            else:
                self._send(200, _top([(NAMES[allowed[0]], -4.0)]))
            return
        user = body["messages"][-1]["content"]
        if "alpha" in user:
            self._send(200, _top([("yes", -0.2), ("Yes", -2.0), ("no", -1.5), ("maybe", -3.0)]))
        else:
            self._send(200, _top([("no", -0.1), ("No", -2.5), ("maybe", -3.0)]))


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


async def test_p_yes_exact_and_forced_missing_side(base_url: str) -> None:
    State.requests.clear()
    judge = OpenAIJudge(base_url, "m", yes_token_ids=[1, 2, 3], no_token_ids=[4, 5, 6], max_concurrency=2)
    prompts = [
        judge_prompt("c", "alpha beta", "Uses alpha.", Task.GENERIC),
        judge_prompt("c", "beta", "x", Task.GENERIC),
    ]
    p = await judge.p_yes(prompts)
    l_yes = math.log(math.exp(-0.2) + math.exp(-2.0))
    assert p[0] == pytest.approx(sig(l_yes - (-1.5)))
    l_no = math.log(math.exp(-0.1) + math.exp(-2.5))
    assert p[1] == pytest.approx(sig(-4.0 - l_no))  # yes forced: its own log-prob, no constant
    forced = [r for r in State.requests if r.get("allowed_token_ids")]
    assert [r["allowed_token_ids"] for r in forced] == [[1, 2, 3]]
    # Requests run concurrently: find the first prompt's by its content.
    sent = [r for r in State.requests if r["messages"][1]["content"] == prompts[0].prefix + prompts[0].suffix]
    assert len(sent) == 1
    first = sent[0]
    assert first["messages"][0]["content"] == prompts[0].system
    assert first["max_tokens"] == 1 and first["logprobs"] is True and first["top_logprobs"] == 20
    await judge.close()


async def test_missing_side_without_ids_raises(base_url: str) -> None:
    judge = OpenAIJudge(base_url, "m")
    with pytest.raises(BackendUnavailable, match="no logprob for 'yes'"):
        await judge.p_yes([judge_prompt("c", "beta", "x", Task.GENERIC)])
    State.forced_returns_nothing = True
    try:
        judge2 = OpenAIJudge(base_url, "m", yes_token_ids=[1], no_token_ids=[4])
        with pytest.raises(BackendUnavailable, match="even when restricted"):
            await judge2.p_yes([judge_prompt("c", "beta", "x", Task.GENERIC)])
    finally:
        State.forced_returns_nothing = False
    await judge.close()


async def test_retries_then_gives_up(base_url: str) -> None:
    judge = OpenAIJudge(base_url, "m", max_retries=2, backoff_s=0.0)
    State.fail_next = 2
    p = await judge.p_yes([judge_prompt("c", "alpha", "r", Task.GENERIC)])
    assert 0.5 < p[0] < 1.0
    State.fail_next = 3
    with pytest.raises(BackendUnavailable, match="after 3 attempts: HTTP 503"):
        await judge.p_yes([judge_prompt("c", "alpha", "r", Task.GENERIC)])
    State.fail_next = 0
    await judge.close()


async def test_unreachable_and_refused(base_url: str) -> None:
    dead = OpenAIJudge("http://127.0.0.1:9/v1", "m", max_retries=1, backoff_s=0.0, timeout_s=2.0)
    with pytest.raises(BackendUnavailable, match="failed after 2 attempts"):
        await dead.p_yes([judge_prompt("c", "alpha", "r", Task.GENERIC)])
    await dead.close()
    wrong = OpenAIJudge(base_url.replace("/v1", "/v2"), "m")
    with pytest.raises(BackendUnavailable, match="HTTP 404"):
        await wrong.p_yes([judge_prompt("c", "alpha", "r", Task.GENERIC)])
    await wrong.close()


async def test_generate(base_url: str) -> None:
    judge = OpenAIJudge(base_url, "m")
    out = await judge.generate([GenerationRequest(system="s", user="hello world", seed=7)])
    assert out == ["echo seed=7 hello worl"]
    await judge.close()
