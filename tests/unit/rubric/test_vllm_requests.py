"""vLLM judge request building and log-prob folding (pure functions; vLLM not needed)."""

from __future__ import annotations

import math

import pytest

from reward_server.backends.base import GenerationRequest
from reward_server.backends.vllm_judge import (
    fold_by_ids,
    generation_sampling_kwargs,
    judge_sampling_kwargs,
    p_yes_from,
)
from reward_server.errors import ModelLoadError


def test_judge_sampling_kwargs() -> None:
    kw = judge_sampling_kwargs(top_logprobs=20)
    assert kw == {"max_tokens": 1, "temperature": 0.0, "logprobs": 20, "detokenize": False}
    forced = judge_sampling_kwargs(top_logprobs=5, allowed_token_ids=(7, 9))
    assert forced["allowed_token_ids"] == [7, 9] and forced["max_tokens"] == 1


def test_generation_kwargs_seed() -> None:
    r = GenerationRequest(system="s", user="u", max_new_tokens=64, temperature=0.6, top_p=0.95)
    assert generation_sampling_kwargs(r, 11) == {"max_tokens": 64, "temperature": 0.6, "top_p": 0.95, "seed": 11}
    r2 = GenerationRequest(system="s", user="u", seed=3)
    assert generation_sampling_kwargs(r2, 11)["seed"] == 3


def test_fold_and_p() -> None:
    lps = {10: math.log(0.3), 11: math.log(0.1), 20: math.log(0.2), 99: math.log(0.4)}
    l_yes, l_no = fold_by_ids(lps, [10, 11, 12]), fold_by_ids(lps, [20, 21])
    assert l_yes == pytest.approx(math.log(0.4)) and l_no == pytest.approx(math.log(0.2))
    assert p_yes_from(l_yes, l_no) == pytest.approx(0.4 / 0.6)  # type: ignore[arg-type]
    assert fold_by_ids(lps, [5]) is None
    assert p_yes_from(-1000.0, 0.0) == pytest.approx(0.0) and p_yes_from(0.0, -1000.0) == 1.0


def test_constructing_without_vllm_fails_clearly() -> None:
    try:
        import vllm  # noqa: F401

        pytest.skip("vllm is installed here")
    except ImportError:
        pass
    from reward_server.backends.vllm_judge import VLLMJudge

    with pytest.raises(ModelLoadError, match="reward-server\\[gpu\\]"):
        VLLMJudge("some/model")
