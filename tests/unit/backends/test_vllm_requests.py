"""vLLM judge request building (pure functions; vLLM not needed). The real engine: tests/vllm."""

from __future__ import annotations

import pytest

from reward_server.backends.base import GenerationRequest
from reward_server.backends.vllm_judge import generation_sampling_kwargs, judge_sampling_kwargs
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


def test_constructing_without_vllm_fails_clearly() -> None:
    try:
        import vllm  # noqa: F401

        pytest.skip("vllm is installed here")
    except ImportError:
        pass
    from reward_server.backends.vllm_judge import VLLMJudge

    with pytest.raises(ModelLoadError, match="reward-server\\[gpu\\]"):
        VLLMJudge("some/model")
