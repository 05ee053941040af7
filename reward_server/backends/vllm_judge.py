"""Judge engine on an in-process vLLM engine (GPU), with vLLM's automatic prefix caching.

One request per judgment: the chat-rendered prompt (text before rubric, so prompts on the same
text share KV blocks), ``max_tokens=1``, greedy, ``logprobs=top_logprobs``. The yes/no
log-probs are read by token id (case/space variants resolved from the tokenizer at load time)
and folded with logsumexp; ``p_yes = sigmoid(l_yes - l_no)``. vLLM returns the *raw* model
log-probs of the top tokens plus the sampled token. When one side has no variant in the top
list, a second request restricts sampling to that side's ids (``allowed_token_ids``), so the
sampled token is that side's most likely variant and its raw log-prob comes back: exact,
never a constant. ``import vllm`` happens only when an engine is built.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Sequence
from typing import Any

from reward_server.backends.base import GenerationRequest, Health, JudgePrompt
from reward_server.backends.settings import VLLMJudgeSettings
from reward_server.backends.yes_no import fold_by_ids, p_yes, render_chat, yes_no_ids
from reward_server.errors import BackendUnavailable, ModelLoadError

logger = logging.getLogger(__name__)


def judge_sampling_kwargs(*, top_logprobs: int, allowed_token_ids: Sequence[int] | None = None) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments for one yes/no judgment."""
    kw: dict[str, Any] = {"max_tokens": 1, "temperature": 0.0, "logprobs": top_logprobs, "detokenize": False}
    if allowed_token_ids:
        kw["allowed_token_ids"] = list(allowed_token_ids)
    return kw


def generation_sampling_kwargs(request: GenerationRequest, default_seed: int) -> dict[str, Any]:
    return {
        "max_tokens": request.max_new_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "seed": default_seed if request.seed is None else request.seed,
    }


class VLLMJudge:
    """JudgeEngine on ``vllm`` AsyncLLM (see module doc)."""

    def __init__(
        self,
        model: str,
        *,
        gpu_memory_utilization: float = 0.85,
        max_model_len: int | None = None,
        dtype: str = "auto",
        seed: int = 0,
        top_logprobs: int = 20,
        model_id: str | None = None,
    ) -> None:
        try:
            from transformers import AutoTokenizer
            from vllm import AsyncEngineArgs
        except ImportError as e:
            raise ModelLoadError(
                f"the vllm judge needs vLLM on a GPU machine ({e}): pip install 'reward-server[gpu]'"
            ) from e
        try:
            from vllm.v1.engine.async_llm import AsyncLLM as Engine
        except ImportError:  # older layouts
            from vllm import AsyncLLMEngine as Engine
        self._tok = AutoTokenizer.from_pretrained(model)
        self._yes, self._no = yes_no_ids(self._tok)
        args = AsyncEngineArgs(
            model=model,
            enable_prefix_caching=True,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            dtype=dtype,
            seed=seed,
            max_logprobs=max(top_logprobs, 20),
        )
        try:
            self._engine: Any = Engine.from_engine_args(args)
        except Exception as e:
            raise ModelLoadError(f"vLLM could not start {model!r}: {type(e).__name__}: {e}") from e
        self._top = top_logprobs
        self._seed = seed
        self._ids = itertools.count()
        self._model_id = model_id or model

    @classmethod
    def from_settings(cls, settings: VLLMJudgeSettings) -> VLLMJudge:
        from reward_server.backends.smollm2 import resolve_model

        model, model_id = resolve_model(settings.model)
        return cls(
            model,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            max_model_len=settings.max_model_len,
            dtype=settings.dtype,
            seed=settings.seed,
            model_id=model_id,
        )

    @property
    def model_id(self) -> str:
        return self._model_id

    async def _run(self, prompt: str, kwargs: dict[str, Any]) -> Any:
        from vllm import SamplingParams

        final = None
        try:
            async for out in self._engine.generate(prompt, SamplingParams(**kwargs), f"judge-{next(self._ids)}"):
                final = out
        except Exception as e:
            raise BackendUnavailable(f"vLLM judge {self._model_id} failed: {type(e).__name__}: {e}") from e
        if final is None or not final.outputs:
            raise BackendUnavailable(f"vLLM judge {self._model_id} returned no output")
        return final.outputs[0]

    async def _first_logprobs(self, prompt: str, allowed: Sequence[int] | None) -> dict[int, float]:
        out = await self._run(prompt, judge_sampling_kwargs(top_logprobs=self._top, allowed_token_ids=allowed))
        if not out.logprobs:
            raise BackendUnavailable(f"vLLM judge {self._model_id} returned no logprobs")
        return {int(t): float(lp.logprob) for t, lp in out.logprobs[0].items()}

    async def _one(self, p: JudgePrompt) -> float:
        text = render_chat(self._tok, p.system, p.prefix + p.suffix)
        lps = await self._first_logprobs(text, None)
        l_yes, l_no = fold_by_ids(lps, self._yes), fold_by_ids(lps, self._no)
        if l_yes is None:
            l_yes = fold_by_ids(await self._first_logprobs(text, self._yes), self._yes)
        if l_no is None:
            l_no = fold_by_ids(await self._first_logprobs(text, self._no), self._no)
        if l_yes is None or l_no is None:
            raise BackendUnavailable(f"vLLM judge {self._model_id} gave no logprob for yes or no")
        return p_yes(l_yes, l_no)

    async def p_yes(self, prompts: Sequence[JudgePrompt]) -> list[float]:
        return list(await asyncio.gather(*(self._one(p) for p in prompts)))

    async def _gen(self, r: GenerationRequest) -> str:
        out = await self._run(render_chat(self._tok, r.system, r.user), generation_sampling_kwargs(r, self._seed))
        if out.text is not None:
            return str(out.text)
        return str(self._tok.decode(out.token_ids, skip_special_tokens=True))

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[str]:
        return list(await asyncio.gather(*(self._gen(r) for r in requests)))

    async def health(self) -> Health:
        try:
            await self._engine.check_health()
        except Exception as e:
            return Health(False, f"vLLM engine {self._model_id}: {type(e).__name__}: {e}")
        return Health(True)

    async def close(self) -> None:
        shutdown = getattr(self._engine, "shutdown", None)
        if callable(shutdown):
            shutdown()
