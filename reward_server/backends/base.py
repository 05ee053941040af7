"""Protocols every engine implements. Async, batch in -> batch out, results in input order.

Engines raise :class:`reward_server.errors.BackendUnavailable` (or let another exception
propagate) when they cannot answer; they never return a made-up number. ``health()`` says
whether the engine can answer now; the hosting layer aggregates it and the gRPC health
service follows it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable


@dataclass(frozen=True)
class Health:
    """Whether an engine can answer now, and if not, why (for logs and health checks)."""

    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class JudgePrompt:
    """One yes/no question to the judge, rendered: the chat's system message and the user
    message split in two. ``prefix`` is everything before the rule (shared by every rule
    judged on the same text, so its KV can be reused) and ``suffix`` starts with the rule and
    holds the rest of the user message (template parl-released: the rule block's closing tag;
    parl-v2: nothing; parl-v1: the question). ``prefix + suffix`` is the user message.

    The text judged is the prefix's last block (``<Tag>...</Tag>`` or ``## Heading``) and the
    criterion the suffix's first (the fake judge reads them so).
    """

    system: str
    prefix: str
    suffix: str


@dataclass(frozen=True)
class GenerationRequest:
    """One sampled completion of a chat prompt (the rubric generator's path).

    ``max_new_tokens`` None: up to the model's context (what a vLLM server does for a request
    without ``max_tokens``, as PARL's rubric-generation scripts send). ``top_k`` None: no top-k
    cut. ``enable_thinking``: the chat template's thinking switch for this request; ``"engine"``
    takes the engine's ``enable_thinking`` setting, None sends no switch (the template's own
    default: a Qwen3 template thinks).
    """

    system: str
    user: str
    max_new_tokens: int | None = 512
    temperature: float = 0.6
    top_p: float = 0.95
    seed: int | None = None
    top_k: int | None = None
    enable_thinking: bool | Literal["engine"] | None = "engine"

    def thinking(self, engine_setting: bool) -> bool | None:
        """The thinking switch to render this request with (None: send none)."""
        return engine_setting if self.enable_thinking == "engine" else self.enable_thinking


@runtime_checkable
class JudgeEngine(Protocol):
    """A judge LLM: P(yes) for yes/no questions, and sampled generation."""

    @property
    def model_id(self) -> str: ...

    async def p_yes(self, prompts: Sequence[JudgePrompt]) -> list[float]:
        """p_yes = e^l_yes / (e^l_yes + e^l_no) from the next-token log-probs, per prompt."""
        ...

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[str]:
        """One completion per request, in order."""
        ...

    async def health(self) -> Health: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class NLIPair:
    premise: str
    hypothesis: str


@dataclass(frozen=True)
class NLIScore:
    """Entailment probability (softmax over the 3 NLI labels, entailment column)."""

    entailment: float
    truncated: bool = False  # the pair did not fit in the model's max length and was cut


@runtime_checkable
class NLIEngine(Protocol):
    """A 3-way NLI cross-encoder (or anything that behaves like one)."""

    @property
    def model_id(self) -> str: ...

    @property
    def max_length(self) -> int:
        """Most tokens one (premise, hypothesis) pair may take before truncation."""
        ...

    async def token_counts(self, texts: Sequence[str]) -> list[int]:
        """Tokens each text takes on its own (no special tokens); for windowing policies."""
        ...

    async def entailment(self, pairs: Sequence[NLIPair]) -> list[NLIScore]: ...

    async def health(self) -> Health: ...

    async def close(self) -> None: ...
