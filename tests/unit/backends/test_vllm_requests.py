"""vLLM judge request building (pure functions; vLLM not needed). The real engine: tests/vllm."""

from __future__ import annotations

import pytest

from reward_server.backends.base import GenerationRequest
from reward_server.backends.vllm_judge import generation_sampling_kwargs, judge_sampling_kwargs, prompt_token_ids
from reward_server.errors import ModelLoadError


def test_judge_sampling_kwargs() -> None:
    # the log-probs of exactly the variant ids, greedy, one token: no top-k, no forcing
    kw = judge_sampling_kwargs((7, 9, 11))
    assert kw == {"max_tokens": 1, "temperature": 0.0, "logprob_token_ids": [7, 9, 11], "detokenize": False}


def test_generation_kwargs_seed() -> None:
    r = GenerationRequest(system="s", user="u", max_new_tokens=64, temperature=0.6, top_p=0.95)
    assert generation_sampling_kwargs(r, 11) == {"max_tokens": 64, "temperature": 0.6, "top_p": 0.95, "seed": 11}
    r2 = GenerationRequest(system="s", user="u", seed=3)
    assert generation_sampling_kwargs(r2, 11)["seed"] == 3
    # the rubric generator as released: top-k 20, no token cap (vLLM gives the rest of the context)
    r3 = GenerationRequest(system="s", user="u", max_new_tokens=None, top_k=20)
    assert generation_sampling_kwargs(r3, 0) | {"seed": 0} == {
        "max_tokens": None, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "seed": 0,
    }


def test_prompt_ids_add_no_second_bos() -> None:
    """The chat template already writes the model's special tokens; vLLM's chat path tokenizes
    the rendered prompt without adding them. encode() with its defaults (the engine before issue
    52) added a second one for tokenizers that add a BOS: here BERT's [CLS] (and a [SEP])."""
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from reward_server.backends.tiny_models import tokenizer_dir

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir()))
    rendered = f"{tok.cls_token} system: judge. user: is it? assistant:"
    ids = prompt_token_ids(tok, rendered)
    assert ids.count(tok.cls_token_id) == 1 and ids[0] == tok.cls_token_id
    assert list(tok.encode(rendered)).count(tok.cls_token_id) == 2  # what it was


def test_constructing_without_vllm_fails_clearly() -> None:
    try:
        import vllm  # noqa: F401

        pytest.skip("vllm is installed here")
    except ImportError:
        pass
    from reward_server.backends.vllm_judge import VLLMJudge

    with pytest.raises(ModelLoadError, match="reward-server\\[gpu\\]"):
        VLLMJudge("some/model")
