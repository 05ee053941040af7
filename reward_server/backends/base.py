"""Protocols every engine implements. Async, batch in -> batch out, results in input order.

Engines raise :class:`reward_server.errors.BackendUnavailable` (or let another exception
propagate) when they cannot answer; they never return a made-up number.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class JudgePrompt:
    """One yes/no question to the judge about (context, text, rule).

    ``system``, ``prefix`` and ``suffix`` are the rendered prompt: the chat's system message and
    the user message split in two, ``prefix`` ending right after the text block (shared by every
    rule judged on the same text) and ``suffix`` holding the rubric block and the question.
    LLM engines use only the rendered fields; ``context``, ``text`` and ``rule`` are the
    structured triple the prompt was rendered from (deterministic fakes judge from it).
    """

    system: str
    prefix: str
    suffix: str
    context: str
    text: str
    rule: str


@dataclass(frozen=True)
class GenerationRequest:
    """One sampled completion of a chat prompt (the rubric generator's path)."""

    system: str
    user: str
    max_new_tokens: int = 512
    temperature: float = 0.6
    top_p: float = 0.95
    seed: int | None = None


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

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        """Tokens each text takes on its own (no special tokens); for windowing policies."""
        ...

    async def entailment(self, pairs: Sequence[NLIPair]) -> list[NLIScore]: ...

    async def close(self) -> None: ...
