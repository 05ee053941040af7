"""VLLMJudge on vLLM's CPU build (SmolLM2, fp32) against the transformers judge on the same
weights, and the PARL-A reward of a Score call through a real server on each."""

from __future__ import annotations

import json
from typing import Any

import pytest

from reward_server import domain as d
from reward_server.app import RewardApp
from reward_server.backends.base import GenerationRequest
from reward_server.client import AsyncRewardClient
from reward_server.rubric.templates import judge_prompts

from .conftest import LONG_REVIEW, PROMPTS, RULES, TOP_K, NaturalRanks, Script, require_vllm

require_vllm()
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

TOLERANCE = 1e-3


async def test_vllm_judge_equals_transformers_in_and_out_of_top_k(
    vllm_server: tuple[RewardApp, Any], reference: Any, natural_ranks: NaturalRanks
) -> None:
    _, judge = vllm_server
    got = await judge.p_yes(PROMPTS)
    want = reference.p_yes_sync(PROMPTS, share_prefix=False)
    dp = [abs(a - b) for a, b in zip(got, want, strict=True)]
    print(f"vllm engine: max |dp| = {max(dp):.2e} over {len(dp)} prompts")
    assert max(dp) < TOLERANCE, dp
    ranks = [natural_ranks(p) for p in PROMPTS]
    # the prompts cover what a top-20 read would miss: a variant, every "yes", every "no"
    assert all(any(r < TOP_K for r in rk.values()) for rk in ranks[:-1])
    assert all(any(r >= TOP_K for r in rk.values()) for rk in ranks)
    assert any(natural_ranks.side_outside(rk, "yes") for rk in ranks)
    assert any(natural_ranks.side_outside(rk, "no") for rk in ranks)


async def test_default_readout_is_released_from_the_logits(
    vllm_server: tuple[RewardApp, Any], natural_ranks: NaturalRanks
) -> None:
    """With the default config the vLLM engine's p_yes is P(yes) / (P(yes) + P(no)) over the
    lowercase tokens, computed from SmolLM2's logits (transformers, fp64 softmax), to 1e-5."""
    _, judge = vllm_server
    assert judge.p_yes_readout == "released"
    got = await judge.p_yes(PROMPTS)
    want = [natural_ranks.released(p) for p in PROMPTS]
    dp = max(abs(a - b) for a, b in zip(got, want, strict=True))
    print(f"vllm engine, released read-out: max |dp| vs the logits = {dp:.2e} over {len(PROMPTS)} prompts")
    assert dp <= 1e-5
    assert max(abs(a - natural_ranks.pooled(p)) for a, p in zip(want, PROMPTS, strict=True)) > 1e-2


async def test_prefix_cache_serves_a_repeated_text(vllm_server: tuple[RewardApp, Any]) -> None:
    _, judge = vllm_server
    prompts = judge_prompts("Kettle K9, 4 stars", LONG_REVIEW.replace("blender", "kettle"), RULES, d.Task.AMAZON)
    await judge.p_yes(prompts[:1])  # the text's KV blocks enter the cache
    before_cached, before_prompt = judge.stats.cached_tokens, judge.stats.prompt_tokens
    await judge.p_yes(prompts[1:])  # the other rules on the same text
    cached = judge.stats.cached_tokens - before_cached
    total = judge.stats.prompt_tokens - before_prompt
    print(f"prefix cache: {cached} of {total} prompt tokens cached")
    assert cached > 0.5 * total  # the shared text, a few hundred tokens per prompt
    # vLLM reuses whole KV blocks: at least every full block of the prefix each prompt shares
    # with the first, at kind: vllm's block size (32 on CPU, not vLLM's CPU default of 128)
    block = judge.cache_kwargs["block_size"]
    assert block == (32 if _on_cpu() else block)
    first = judge.token_ids(judge.render(prompts[0].system, prompts[0].prefix + prompts[0].suffix))
    shared = 0
    for p in prompts[1:]:
        ids = judge.token_ids(judge.render(p.system, p.prefix + p.suffix))
        common = next((i for i, (a, b) in enumerate(zip(first, ids, strict=False)) if a != b), len(ids))
        shared += common // block * block
    assert cached >= shared, (cached, shared)


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


async def test_vllm_generates(vllm_server: tuple[RewardApp, Any]) -> None:
    _, judge = vllm_server
    (text,) = await judge.generate([GenerationRequest(system="You help.", user="Name a fruit.", max_new_tokens=8)])
    assert text.strip()
    assert (await judge.health()).ok


HISTORY = (
    d.HistoryItem("Blender X200", "honestly love it. cheap, loud, works. five stars."),
    d.HistoryItem("Toaster T1", "honestly meh. cheap, slow, works. three stars."),
)
TARGET = d.HistoryItem("Kettle K9", "honestly great. cheap, fast, works. five stars.")
BASELINES = ("This kettle is a wonderful addition to any kitchen.", "Great kettle, boils fast!")
PARL_RULES = [
    "The review starts with the word 'honestly'.",
    "The review is written in lowercase letters.",
    "The review gives a star rating at the end.",
    "The review mentions the price.",
]


async def _parl_a(app: RewardApp) -> d.ItemResult:
    spec = d.ParlRewardSpec(
        history=HISTORY,
        policy_output=json.dumps([{"rule": r} for r in PARL_RULES]),
        target=TARGET,
        baselines=BASELINES,
        variant=d.ParlVariant.PARL_A,
        task=d.Task.AMAZON,
    )
    async with AsyncRewardClient(f"127.0.0.1:{app.port}", timeout_s=600) as client:
        (result,) = await client.score([d.ScoreItem("parl", spec)])
    return result


async def test_score_parl_a_same_reward_on_vllm_and_transformers(
    vllm_server: tuple[RewardApp, Any], transformers_server: RewardApp
) -> None:
    app, _ = vllm_server
    on_vllm, on_transformers = await _parl_a(app), await _parl_a(transformers_server)
    assert on_vllm.status is d.ItemStatus.OK and on_transformers.status is d.ItemStatus.OK
    assert on_vllm.reward is not None and on_transformers.reward is not None
    print(f"PARL-A: vllm {on_vllm.reward:.6f}, transformers {on_transformers.reward:.6f}")
    # rules survived validation (threshold 0.2), so the reward is not the 0.1 floor
    assert on_transformers.components["n_valid"] >= 2 and on_transformers.components["floor_applied"] == 0.0
    assert abs(on_vllm.reward - on_transformers.reward) < TOLERANCE
    for name, value in on_transformers.components.items():
        assert on_vllm.components[name] == pytest.approx(value, abs=TOLERANCE), name


def test_a_closed_judge_exits_without_a_traceback(close_and_exit: Script) -> None:
    """AsyncLLM.__del__ shuts down again; left for interpreter exit, it printed "Exception
    ignored ... TypeError" on torn-down globals (vLLM 0.32). close() drops the last reference.
    The script (conftest.CLOSE_AND_EXIT) started with the session; its end is awaited here."""
    rc, stderr = close_and_exit.wait(timeout_s=600)
    assert rc == 0, stderr[-2000:]
    assert "Exception ignored" not in stderr, stderr[-2000:]
