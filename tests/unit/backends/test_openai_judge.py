"""OpenAIJudge against a small OpenAI-compatible HTTP server started in the test (127.0.0.1:0).

The server's "model" has a full next-token table per prompt (answer variants ``yes``=1,
``Yes``=2, `` yes``=3, ``no``=4, ``No``=5, `` no``=6 and twenty filler tokens at -3.0, -3.1, ... -4.9),
so the exact p_yes is known. It answers greedily and behaves like one of four servers
(``State.mode``):

* ``vllm``: vLLM 0.32, honours ``logprob_token_ids``, ``allowed_token_ids`` (raw log-probs) and
  ``return_tokens_as_token_ids``;
* ``old-vllm``: ignores ``logprob_token_ids`` (natural top list), honours the other two;
* ``processed``: like ``old-vllm`` but reports log-probs renormalized over the allowed tokens
  (vLLM's ``--logprobs-mode processed_logprobs``);
* ``openai``: none of the extensions, tokens as text, at most 20 top log-probs.

Any of them honours PARL's ``structured_outputs`` choice between "yes" and "no" when asked (but
``openai``): the answer is restricted to those two tokens before the log-probs are reported
(renormalised over them), as vLLM applies a guided choice.

The engine's read-out (``p_yes_readout``): ``released`` counts the tokens ``yes`` and ``no``;
``pooled-v1`` (before issue 52) every spelling; most machinery tests run pooled-v1, which has
variants outside the top 20 to force.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from reward_server.backends.base import GenerationRequest, JudgePrompt
from reward_server.backends.openai_judge import OpenAIJudge
from reward_server.domain import Task
from reward_server.errors import BackendUnavailable, ConfigError, EngineError
from reward_server.rubric.templates import judge_prompt

VOCAB = {"yes": 1, "Yes": 2, " yes": 3, "no": 4, "No": 5, " no": 6}
NAMES = {v: k for k, v in VOCAB.items()} | {100 + k: f"filler{k}" for k in range(20)}
FILLERS = {100 + k: -3.0 - 0.1 * k for k in range(20)}
TABLES = {
    # yes and no listed, " yes", "No" and " no" below every filler (outside the top 20)
    "alpha": {1: -0.2, 2: -2.0, 3: -9.0, 4: -1.5, 5: -8.0, 6: -9.5} | FILLERS,
    # no side listed, the whole yes side outside the top 20
    "beta": {4: -0.1, 5: -2.5, 1: -7.0, 2: -8.0, 3: -9.0, 6: -10.0} | FILLERS,
}


def exact(name: str, readout: str = "pooled-v1") -> float:
    t = TABLES[name]
    sides = ((1, 2, 3), (4, 5, 6)) if readout == "pooled-v1" else ((1,), (4,))
    y, n = (sum(math.exp(t[i]) for i in ids) for ids in sides)
    return y / (y + n)


class State:
    mode = "vllm"
    fail_next = 0  # answer 503 this many times first
    requests: ClassVar[list[dict[str, Any]]] = []


def _tok(tid: int, as_ids: bool) -> str:
    return f"token_id:{tid}" if as_ids else NAMES[tid]


def _answer(body: dict[str, Any]) -> dict[str, Any]:
    user = body["messages"][-1]["content"]
    table = TABLES["alpha" if "alpha" in user else "beta"]
    mode = State.mode
    ext = mode != "openai"
    as_ids = ext and bool(body.get("return_tokens_as_token_ids"))
    allowed = body.get("allowed_token_ids") if ext else None
    choice = (body.get("structured_outputs") or {}).get("choice") if ext else None
    if choice:  # a guided choice: tokens spelling a start of a choice, restricted before log-probs
        allowed = [t for t in table if any(c.startswith(NAMES[t]) for c in choice)]
    pool = {t: lp for t, lp in table.items() if not allowed or t in allowed}
    sampled = max(pool, key=lambda t: pool[t])
    lp_of = dict(table)
    if (mode == "processed" and allowed) or choice:  # renormalized over the allowed tokens
        norm = math.log(sum(math.exp(v) for v in pool.values()))
        lp_of = {t: v - norm for t, v in pool.items()}
    ids = body.get("logprob_token_ids") if mode == "vllm" else None
    k = min(int(body.get("top_logprobs") or 0), 20)
    ranked = pool if choice else table
    listed = list(ids) if ids else sorted(ranked, key=lambda t: -ranked[t])[:k]
    top = [{"token": _tok(t, as_ids), "logprob": lp_of[t]} for t in listed]
    content = [{"token": _tok(sampled, as_ids), "logprob": lp_of[sampled], "top_logprobs": top}]
    return {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": body["model"],
        "choices": [
            {
                "index": 0,
                "finish_reason": "length",
                "message": {"role": "assistant", "content": NAMES[sampled]},
                "logprobs": {"content": content},
            }
        ],
    }


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        return None

    def _send(self, code: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "m", "object": "model", "created": 0, "owned_by": "t"}]})
        else:
            self._send(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/chat/completions":
            self._send(404, {"error": {"message": "not found"}})
            return
        State.requests.append(body)
        if State.fail_next > 0:
            State.fail_next -= 1
            self._send(503, {"error": {"message": "busy"}}, {"retry-after-ms": "1"})
            return
        if body.get("max_tokens", 0) > 1:  # generation
            user = body["messages"][-1]["content"]
            text = f"echo seed={body.get('seed')} {user[:10]}"
            self._send(200, {"id": "g", "object": "chat.completion", "created": 0, "model": body["model"],
                             "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": text}}]})
            return
        self._send(200, _answer(body))


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    State.mode, State.fail_next = "vllm", 0
    State.requests.clear()
    yield
    State.mode, State.fail_next = "vllm", 0


PROMPTS = [
    judge_prompt("c", "alpha beta", "Uses alpha.", Task.GENERIC),
    judge_prompt("c", "beta", "x", Task.GENERIC),
]
EXACT = [exact("alpha"), exact("beta")]  # pooled-v1
RELEASED = [exact("alpha", "released"), exact("beta", "released")]


def _judge(base_url: str, **kw: Any) -> OpenAIJudge:
    kw.setdefault("answer_tokens", VOCAB)
    kw.setdefault("p_yes_readout", "pooled-v1")
    return OpenAIJudge(base_url, "m", max_concurrency=4, **kw)


def _sent(prompt: JudgePrompt) -> list[dict[str, Any]]:
    return [r for r in State.requests if r["messages"][1]["content"] == prompt.prefix + prompt.suffix]


async def test_vllm_logprob_token_ids_exact_in_one_request(base_url: str) -> None:
    judge = _judge(base_url)
    p = await judge.p_yes(PROMPTS)
    assert p == pytest.approx(EXACT, abs=1e-12)
    assert len(State.requests) == 2  # one per judgment, whatever the variants' ranks
    (first,) = _sent(PROMPTS[0])
    assert first["messages"][0]["content"] == PROMPTS[0].system
    assert first["max_tokens"] == 1 and first["temperature"] == 0.0 and first["logprobs"] is True
    assert first["top_logprobs"] == 20 and first["logprob_token_ids"] == [1, 2, 3, 4, 5, 6]
    assert first["return_tokens_as_token_ids"] is True and "allowed_token_ids" not in first
    await judge.close()


async def test_older_vllm_forces_each_missing_variant(base_url: str) -> None:
    State.mode = "old-vllm"
    judge = _judge(base_url)
    p = await judge.p_yes(PROMPTS)
    # exact; the old single forced request over all yes ids read only "yes": 0.000923 for 0.001387
    assert p == pytest.approx(EXACT, abs=1e-12)
    forced = sorted(r["allowed_token_ids"][0] for r in _sent(PROMPTS[1]) if "allowed_token_ids" in r)
    assert forced == [1, 2, 3, 6]  # every variant outside the top 20, each on its own
    assert sorted(r["allowed_token_ids"][0] for r in _sent(PROMPTS[0]) if "allowed_token_ids" in r) == [3, 5, 6]
    await judge.close()


async def test_processed_logprobs_are_refused(base_url: str) -> None:
    State.mode = "processed"
    judge = _judge(base_url)
    with pytest.raises(ConfigError, match="raw_logprobs"):  # a set-up problem: not retried
        await judge.p_yes(PROMPTS[:1])
    await judge.close()


async def test_plain_openai_api_is_bounded(base_url: str) -> None:
    State.mode = "openai"
    strict = _judge(base_url, vllm_extensions=False)
    with pytest.raises(ConfigError, match=r"only known to lie in \[0\.79"):
        await strict.p_yes(PROMPTS[:1])
    assert all("logprob_token_ids" not in r and "allowed_token_ids" not in r for r in State.requests)
    # alpha: " yes", "No", " no" unknown, each at most e^-4.6 (the 17th filler, the last listed)
    cap = math.exp(-4.6)
    y, n = math.exp(-0.2) + math.exp(-2.0), math.exp(-1.5)
    lo, hi = y / (y + n + 2 * cap), (y + cap) / (y + cap + n)
    loose = _judge(base_url, vllm_extensions=False, max_p_error=(hi - lo) / 2 + 1e-9)
    (p,) = await loose.p_yes(PROMPTS[:1])
    assert p == pytest.approx((lo + hi) / 2, abs=1e-12) and lo <= EXACT[0] <= hi
    # beta: no yes variant listed at all -> [0, 0.0107...]: refused unless max_p_error allows it
    with pytest.raises(ConfigError, match=r"0 yes and 2 no"):
        await loose.p_yes(PROMPTS[1:])
    await strict.close()
    await loose.close()


async def test_without_token_ids_spellings_are_matched(base_url: str) -> None:
    State.mode = "openai"
    judge = OpenAIJudge(base_url, "m", answer_tokens=None, max_p_error=0.5, p_yes_readout="pooled-v1")
    (p,) = await judge.p_yes(PROMPTS[:1])
    # yes, Yes, no listed by spelling; the other 5 spellings unknown, each <= e^-4.6
    cap = math.exp(-4.6)
    y, n = math.exp(-0.2) + math.exp(-2.0), math.exp(-1.5)
    lo, hi = y / (y + n + 3 * cap), (y + 2 * cap) / (y + 2 * cap + n)
    assert p == pytest.approx((lo + hi) / 2, abs=1e-12)
    assert all("logprob_token_ids" not in r for r in State.requests)  # no ids to ask for
    await judge.close()


async def test_sdk_retries_then_gives_up(base_url: str) -> None:
    judge = _judge(base_url, max_retries=2)
    State.fail_next = 2
    assert (await judge.p_yes(PROMPTS[:1])) == pytest.approx(EXACT[:1], abs=1e-12)
    assert len(State.requests) == 3
    State.fail_next = 3
    with pytest.raises(BackendUnavailable, match="after 3 attempts: HTTP 503"):
        await judge.p_yes(PROMPTS[:1])
    await judge.close()


async def test_unreachable_and_refused(base_url: str) -> None:
    dead = OpenAIJudge("http://127.0.0.1:9/v1", "m", max_retries=1, timeout_s=2.0)
    with pytest.raises(BackendUnavailable, match="failed after 2 attempts: APIConnectionError"):
        await dead.p_yes(PROMPTS[:1])
    health = await dead.health()
    assert not health.ok and "unreachable" in health.detail
    await dead.close()
    wrong = OpenAIJudge(base_url.replace("/v1", "/v2"), "m", answer_tokens=VOCAB)
    with pytest.raises(EngineError, match=r"refused the request \(not retried\): HTTP 404"):
        await wrong.p_yes(PROMPTS[:1])
    await wrong.close()


async def test_generate_and_health(base_url: str) -> None:
    judge = _judge(base_url)
    out = await judge.generate([GenerationRequest(system="s", user="hello world", seed=7)])
    assert out == ["echo seed=7 hello worl"]
    assert (await judge.health()).ok
    await judge.close()


# A chat template with a thinking switch, as Qwen3's: with enable_thinking false the assistant turn
# opens with an empty think block; without the switch set, thinking is on.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)


@pytest.mark.parametrize("thinking", [False, True])
async def test_enable_thinking_renders_the_same_prompt_on_every_engine(base_url: str, thinking: bool) -> None:
    """engines.judge.enable_thinking: transformers and vLLM render the chat locally, the OpenAI
    engine sends chat_template_kwargs and the server renders (as vLLM's server does, below)."""
    import torch

    from reward_server.backends.tiny_models import random_causal_lm, tokenizer_dir
    from reward_server.backends.transformers_judge import TransformersJudge
    from reward_server.backends.vllm_judge import engine_prompt

    model, tok = random_causal_lm("tiny-qwen3", tokenizer_dir(), device="cpu", dtype=torch.float32)
    tok.chat_template = THINKING_TEMPLATE
    prompt = judge_prompt("c", "alpha beta", "Uses alpha.", Task.AMAZON)
    local = TransformersJudge.from_model(model, tok, model_id="t", enable_thinking=thinking)
    by_transformers = "".join(local.render(prompt))
    by_vllm = engine_prompt(tok, prompt.system, prompt.prefix + prompt.suffix, enable_thinking=thinking)
    remote = _judge(base_url, enable_thinking=thinking)
    await remote.p_yes([prompt])
    (body,) = State.requests
    assert body["chat_template_kwargs"] == {"enable_thinking": thinking}
    by_server = tok.apply_chat_template(
        body["messages"], tokenize=False, add_generation_prompt=True, **body["chat_template_kwargs"]
    )
    assert by_transformers == by_vllm == by_server
    assert by_server.endswith("<|im_start|>assistant\n" + ("" if thinking else "<think>\n\n</think>\n\n"))


async def test_no_template_switches_sent_without_vllm_extensions(base_url: str) -> None:
    State.mode = "openai"
    await _judge(base_url, vllm_extensions=False, max_p_error=0.5).p_yes(PROMPTS[:1])
    assert all("chat_template_kwargs" not in r for r in State.requests)


# ------------------------------------------------------------------ released read-out (default)
async def test_released_readout_asks_for_yes_and_no_only(base_url: str) -> None:
    """The default read-out is PARL's released one, P(yes) / (P(yes) + P(no)) over the two
    lowercase tokens; on these tables it differs from the pooled one by 0.024 (alpha)."""
    judge = OpenAIJudge(base_url, "m", answer_tokens=VOCAB)  # the defaults
    p = await judge.p_yes(PROMPTS)
    assert p == pytest.approx(RELEASED, abs=1e-12)
    assert abs(p[0] - EXACT[0]) > 0.02
    (first,) = _sent(PROMPTS[0])
    assert first["logprob_token_ids"] == [1, 4] and len(State.requests) == 2
    await judge.close()


async def test_released_readout_on_older_vllm_forces_only_a_missing_word(base_url: str) -> None:
    State.mode = "old-vllm"
    judge = _judge(base_url, p_yes_readout="released")
    assert await judge.p_yes(PROMPTS) == pytest.approx(RELEASED, abs=1e-12)
    assert [r["allowed_token_ids"] for r in State.requests if "allowed_token_ids" in r] == [[1]]  # beta's "yes"
    await judge.close()


async def test_released_readout_on_the_plain_api_renormalises_the_listed_pair(base_url: str) -> None:
    """Without extensions: exact when both words are listed (alpha, even at max_p_error 0), the
    interval otherwise (beta's "yes" is outside the top 20)."""
    State.mode = "openai"
    judge = _judge(base_url, p_yes_readout="released", vllm_extensions=False)
    (p,) = await judge.p_yes(PROMPTS[:1])
    assert p == pytest.approx(RELEASED[0], abs=1e-12)
    with pytest.raises(ConfigError, match="0 yes and 1 no"):
        await judge.p_yes(PROMPTS[1:])
    spelled = OpenAIJudge(base_url, "m", answer_tokens=None, vllm_extensions=False)  # no tokenizer
    assert await spelled.p_yes(PROMPTS[:1]) == pytest.approx(RELEASED[:1], abs=1e-12)
    await judge.close()
    await spelled.close()


@pytest.mark.parametrize("mode", ["vllm", "old-vllm"])
async def test_guided_choice_is_the_released_request(base_url: str, mode: str) -> None:
    """guided_choice sends PARL's structured_outputs choice: the server renormalises over "yes"
    and "no" before it reports, both are listed, the value is the same and nothing is forced."""
    State.mode = mode
    judge = _judge(base_url, p_yes_readout="released", guided_choice=True)
    assert await judge.p_yes(PROMPTS) == pytest.approx(RELEASED, abs=1e-12)
    assert all(r["structured_outputs"] == {"choice": ["yes", "no"]} for r in State.requests)
    assert len(State.requests) == 2 and not any("allowed_token_ids" in r for r in State.requests)
    await judge.close()


def test_settings_refuse_what_cannot_be_sent() -> None:
    from pydantic import ValidationError

    from reward_server.backends.settings import OpenAIJudgeSettings

    with pytest.raises(ValidationError, match="chat_template_kwargs"):
        OpenAIJudgeSettings(base_url="u", model="m", vllm_extensions=False, enable_thinking=True)
    with pytest.raises(ValidationError, match="guided_choice"):
        OpenAIJudgeSettings(base_url="u", model="m", guided_choice=True, p_yes_readout="pooled-v1")
    with pytest.raises(ValidationError, match="guided_choice"):
        OpenAIJudgeSettings(base_url="u", model="m", guided_choice=True, vllm_extensions=False)
    assert OpenAIJudgeSettings(base_url="u", model="m").p_yes_readout == "released"


async def test_generation_sends_top_k_and_thinking_as_asked(base_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A rubric-generator request as released (top_k 20, no thinking switch: the template's
    default, no token cap) and the judge's own setting for a plain request."""
    judge = _judge(base_url, enable_thinking=False)
    released = GenerationRequest(system="s", user="u", top_k=20, enable_thinking=None, max_new_tokens=None, seed=1)
    await judge.generate([released, GenerationRequest(system="s", user="u", seed=2)])
    by_seed = {r["seed"]: r for r in State.requests}
    assert by_seed[1]["top_k"] == 20 and "chat_template_kwargs" not in by_seed[1] and "max_tokens" not in by_seed[1]
    assert by_seed[2]["chat_template_kwargs"] == {"enable_thinking": False} and "top_k" not in by_seed[2]
    State.requests.clear()
    State.mode = "openai"
    with caplog.at_level("WARNING"):
        plain = _judge(base_url, vllm_extensions=False)
    assert "not sent" in caplog.text
    await plain.generate([GenerationRequest(system="s", user="u", top_k=20, enable_thinking=True, seed=3)])
    (body,) = State.requests
    assert "top_k" not in body and "chat_template_kwargs" not in body
    await judge.close()
    await plain.close()
