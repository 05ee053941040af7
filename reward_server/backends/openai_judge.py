"""Judge engine on an OpenAI-compatible endpoint (``vllm serve`` of a large judge, or any server
of the chat completions API), through the ``openai`` SDK.

p_yes is exact whenever the server can report the log-prob of every counted yes/no token id
(``p_yes_readout``: released = the tokens ``yes`` and ``no``; pooled-v1 = every single-token
spelling of yes, Yes, " yes", " Yes" and the same for no; :mod:`reward_server.backends.yes_no`):

1. One request per judgment: ``max_tokens=1``, ``temperature=0``, ``logprobs=true``,
   ``top_logprobs`` (20) and, when the answer token ids are known (from the model's tokenizer),
   vLLM's ``logprob_token_ids`` (return the log-probs of exactly these ids, whatever their rank)
   and ``return_tokens_as_token_ids`` (tokens come back as ``token_id:N``). vLLM 0.32 answers
   with every variant: exact in one request.
2. A server that ignores ``logprob_token_ids`` (older vLLM) answers with its natural top list.
   Each variant missing from it is asked for on its own with ``allowed_token_ids=[id]`` (also a
   vLLM extension): the sampled token IS that variant, and vLLM reports its raw, unrestricted
   log-prob (``--logprobs-mode raw_logprobs``, the default). A forced value above the smallest
   listed log-prob cannot be raw (the variant was outside the list), so it fails the call.
3. A server that can do neither (the OpenAI API: at most 20 top log-probs, no forcing) leaves
   some variants unknown. Each is at most as likely as the least likely listed token, so p_yes
   lies in an interval (:func:`p_yes_bounds`); when its half-width is within ``max_p_error`` the
   midpoint is returned, otherwise :class:`ConfigError` (FAILED_PRECONDITION, not retried:
   this server cannot give the exact value). The default, 0, accepts exact values only. Never
   a constant.

Without a local tokenizer the ids are unknown: listed tokens are matched by spelling and every
spelling of a side that is not listed counts as unknown (case 3). ``vllm_extensions=False``
sends none of vLLM's fields (for servers that refuse unknown fields): cases 1 and 2 are skipped,
and so are the chat template's switches and a generation's ``top_k`` (logged at start).

``guided_choice`` (released read-out) also sends PARL's released request field
``structured_outputs: {choice: [yes, no]}``: vLLM restricts the first token to those that start
"yes" or "no" before it reports log-probs, so the top list holds both words (case 1 without
``logprob_token_ids``); the restricted log-probs differ from the raw ones by one constant, so
``P(yes) / (P(yes) + P(no))`` is the same value. No forcing is asked for under it.

Requests run concurrently under a semaphore (``max_concurrency``). The SDK applies the timeout
and retries (``max_retries``) connection errors, timeouts, 408/409/429 and 5xx with exponential
backoff (0.5 s doubling, at most 8 s, jittered), honouring ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from reward_server.backends.base import GenerationRequest, Health, JudgePrompt
from reward_server.backends.settings import OpenAIJudgeSettings
from reward_server.backends.yes_no import (
    ANSWERS,
    DEFAULT_READOUT,
    PYesReadout,
    chat_messages,
    chat_template_kwargs,
    p_yes_bounds,
    p_yes_exact,
    side_of,
    variants,
)
from reward_server.errors import BackendUnavailable, ConfigError, EngineError, ModelLoadError

logger = logging.getLogger(__name__)

_HEALTH_TTL_S = 5.0
_TOKEN_ID = re.compile(r"^token_id:(\d+)$")
_FORCED_TOLERANCE = 1e-3  # log-prob slack between a forced value and the listed ones (numerics)
GUIDED_CHOICE = {"structured_outputs": {"choice": list(ANSWERS)}}  # PARL's released request field

Entries = list[tuple[str, float]]


def judge_payload(
    model: str, prompt: JudgePrompt, *, top_logprobs: int, token_ids: Sequence[int] = (),
    template_kwargs: Mapping[str, Any] | None = None, guided_choice: bool = False,
) -> dict[str, Any]:
    """Keyword arguments of ``chat.completions.create`` for one yes/no judgment
    (``template_kwargs``: sent as vLLM's ``chat_template_kwargs``; ``guided_choice``: PARL's
    ``structured_outputs`` choice between "yes" and "no")."""
    payload: dict[str, Any] = {
        "model": model,
        "messages": chat_messages(prompt.system, prompt.prefix + prompt.suffix),
        "max_tokens": 1,
        "temperature": 0.0,
        "logprobs": True,
        "top_logprobs": top_logprobs,
    }
    extra: dict[str, Any] = {}
    if token_ids:
        extra |= {"logprob_token_ids": list(token_ids), "return_tokens_as_token_ids": True}
    if template_kwargs:
        extra["chat_template_kwargs"] = dict(template_kwargs)
    if guided_choice:
        extra |= GUIDED_CHOICE
    if extra:
        payload["extra_body"] = extra
    return payload


def first_position(response: Any) -> tuple[Entries, tuple[str, float]]:
    """(top list, sampled token) of the first generated position, as (token, log-prob)."""
    try:
        first = response.choices[0].logprobs.content[0]
        top = [(str(e.token), float(e.logprob)) for e in first.top_logprobs or []]
        return top, (str(first.token), float(first.logprob))
    except (AttributeError, IndexError, TypeError, ValueError) as e:
        raise EngineError(
            f"judge endpoint answered without token log-probs ({e!r}): {str(response)[:300]}"
        ) from e


class OpenAIJudge:
    """JudgeEngine over an OpenAI-compatible HTTP API (see module doc)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        max_concurrency: int = 32,
        timeout_s: float = 60.0,
        max_retries: int = 3,
        top_logprobs: int = 20,
        answer_tokens: Mapping[str, int] | None = None,
        vllm_extensions: bool = True,
        max_p_error: float = 0.0,
        enable_thinking: bool = False,
        p_yes_readout: PYesReadout = DEFAULT_READOUT,
        guided_choice: bool = False,
    ) -> None:
        try:
            from openai import AsyncOpenAI
        except ImportError as e:  # pragma: no cover - depends on the install
            raise ModelLoadError("the openai judge needs the openai SDK: pip install 'reward-server[server]'") from e
        self._base_url = base_url.rstrip("/")
        # A local server without --api-key accepts any key; the SDK insists on one.
        self._client = AsyncOpenAI(
            base_url=self._base_url, api_key=api_key or "EMPTY", timeout=timeout_s, max_retries=max_retries
        )
        self._model = model
        self._sem = asyncio.Semaphore(max_concurrency)
        self._attempts = max_retries + 1
        self._top = top_logprobs
        self._readout: PYesReadout = p_yes_readout
        self._guided = guided_choice
        # spelling -> token id, the spellings the read-out counts
        self._spelling = {t: i for t, i in (answer_tokens or {}).items() if side_of(t, p_yes_readout)}
        self._side = {i: side_of(s, p_yes_readout) for s, i in self._spelling.items()}
        self._ids = {w: sorted({i for i, side in self._side.items() if side == w}) for w in ANSWERS}
        self._extensions = vllm_extensions
        # The chat is rendered by the server: its template switches travel with each request
        # (vLLM's chat_template_kwargs), so every engine renders the same prompt. The OpenAI
        # API refuses unknown fields: without the extensions nothing is sent.
        self._enable_thinking = enable_thinking
        self._template_kwargs = chat_template_kwargs(enable_thinking=enable_thinking) if vllm_extensions else {}
        if not vllm_extensions:
            logger.warning(
                "openai judge %s: vllm_extensions is off, so the chat template's thinking switch "
                "(enable_thinking=%s) and a generation's top_k are not sent: the server renders its "
                "template's default and samples without top-k", model, enable_thinking,
            )
        self._max_p_error = max_p_error
        self._health: tuple[float, Health] | None = None

    @classmethod
    def from_settings(cls, settings: OpenAIJudgeSettings) -> OpenAIJudge:
        vocab: dict[str, int] = {}
        tokenizer = settings.tokenizer or settings.model
        try:  # best effort: without the ids only exact spellings in the top list are found
            from transformers import AutoTokenizer

            from reward_server.backends.yes_no import answer_vocab

            vocab = answer_vocab(AutoTokenizer.from_pretrained(tokenizer), settings.p_yes_readout)
        except Exception as e:
            logger.warning(
                "no local tokenizer %s (%s): yes/no variants outside the top log-probs cannot be asked for",
                tokenizer,
                e,
            )
        return cls(
            settings.base_url,
            settings.model,
            api_key=os.environ.get(settings.api_key_env),
            max_concurrency=settings.max_concurrency,
            timeout_s=settings.request_timeout_s,
            max_retries=settings.max_retries,
            top_logprobs=settings.top_logprobs,
            answer_tokens=vocab,
            vllm_extensions=settings.vllm_extensions,
            max_p_error=settings.max_p_error,
            enable_thinking=settings.enable_thinking,
            p_yes_readout=settings.p_yes_readout,
            guided_choice=settings.guided_choice,
        )

    @property
    def model_id(self) -> str:
        return self._model

    async def _create(self, payload: dict[str, Any]) -> Any:
        import openai

        where = f"judge endpoint {self._base_url}/chat/completions"
        try:
            async with self._sem:
                return await self._client.chat.completions.create(**payload)
        except openai.APIStatusError as e:
            code = e.status_code
            detail = f"HTTP {code}: {str(e.message)[:300]}"
            if code in (408, 409, 429) or code >= 500:  # the SDK retried these
                raise BackendUnavailable(f"{where} failed after {self._attempts} attempts: {detail}") from e
            raise EngineError(f"{where} refused the request (not retried): {detail}") from e
        except openai.APIConnectionError as e:  # connection errors and timeouts, retried
            raise BackendUnavailable(
                f"{where} failed after {self._attempts} attempts: {type(e).__name__}: {e}"
            ) from e

    def _key(self, token: str) -> int | str | None:
        """A listed token as an answer variant: its id (or spelling, ids unknown); None otherwise."""
        m = _TOKEN_ID.match(token)
        if m is not None:
            tid = int(m.group(1))
            return tid if tid in self._side else None
        if self._spelling:
            return self._spelling.get(token)
        return token if side_of(token, self._readout) else None

    def _listed(self, entries: Entries) -> dict[int | str, float]:
        out: dict[int | str, float] = {}
        for token, lp in entries:
            key = self._key(token)
            if key is not None:
                out.setdefault(key, lp)
        return out

    async def _forced(self, prompt: JudgePrompt, token_id: int) -> float | None:
        """The raw log-prob of ``token_id``, sampling restricted to it; None if not honoured."""
        payload = judge_payload(self._model, prompt, top_logprobs=0, template_kwargs=self._template_kwargs)
        payload["extra_body"] = payload.get("extra_body", {}) | {
            "allowed_token_ids": [token_id], "return_tokens_as_token_ids": True,
        }
        _, (token, lp) = first_position(await self._create(payload))
        return lp if self._key(token) == token_id else None

    async def _one(self, prompt: JudgePrompt) -> float:
        all_ids = [*self._ids["yes"], *self._ids["no"]]
        asked = all_ids if self._extensions else []
        top, sampled = first_position(
            await self._create(judge_payload(
                self._model, prompt, top_logprobs=self._top, token_ids=asked, template_kwargs=self._template_kwargs,
                guided_choice=self._guided,
            ))
        )
        listed = self._listed([*top, sampled])
        cap = min(lp for _, lp in (top or [sampled]))  # anything not listed is at most this likely
        if all_ids:
            # forcing one token with allowed_token_ids does not combine with the guided choice
            missing = [] if self._guided else [i for i in asked if i not in listed]
            forced = await asyncio.gather(*(self._forced(prompt, i) for i in missing))
            for tid, lp in zip(missing, forced, strict=True):
                if lp is None:
                    continue
                if lp > cap + _FORCED_TOLERANCE:  # a server set-up problem: retrying cannot help
                    raise ConfigError(
                        f"judge endpoint {self._base_url} gave token {tid}, forced with allowed_token_ids, "
                        f"log-prob {lp:.4f}, above {cap:.4f} of the least likely token it listed: it reports "
                        "restricted (processed) log-probs, not raw ones; serve with vLLM's default "
                        "--logprobs-mode raw_logprobs"
                    )
                listed[tid] = lp
            by_id = {k: v for k, v in listed.items() if isinstance(k, int)}
            exact = p_yes_exact(by_id, self._ids["yes"], self._ids["no"])
            if exact is not None:
                return exact
        return self._bounded(listed, cap)

    def _bounded(self, listed: Mapping[int | str, float], cap: float) -> float:
        known: dict[str, list[float]] = {w: [] for w in ANSWERS}
        for key, lp in listed.items():
            side = self._side.get(key) if isinstance(key, int) else side_of(key, self._readout)
            if side is not None:
                known[side].append(lp)
        if self._spelling:
            unknown = {w: len(self._ids[w]) - len(known[w]) for w in ANSWERS}
        else:  # ids unknown: any spelling not listed may be a token of its own
            unknown = {w: len(variants(w, self._readout)) - len(known[w]) for w in ANSWERS}
        lo, hi = p_yes_bounds(
            known["yes"], known["no"], missing_yes=unknown["yes"], missing_no=unknown["no"], cap=cap
        )
        if (hi - lo) / 2 <= self._max_p_error:
            return (lo + hi) / 2
        raise ConfigError(  # what this server can report; retrying cannot help
            f"judge endpoint {self._base_url} reported {len(known['yes'])} yes and {len(known['no'])} no "
            f"variant log-probs and could not be asked for the other {unknown['yes'] + unknown['no']}: p_yes "
            f"is only known to lie in [{lo:.6f}, {hi:.6f}]. Serve the judge with vLLM (logprob_token_ids or "
            "allowed_token_ids), give engines.judge.tokenizer, or accept the midpoint with "
            f"engines.judge.max_p_error >= {(hi - lo) / 2:.2g}"
        )

    async def p_yes(self, prompts: Sequence[JudgePrompt]) -> list[float]:
        return list(await asyncio.gather(*(self._one(p) for p in prompts)))

    async def _gen(self, r: GenerationRequest) -> str:
        payload: dict[str, Any] = {
            "model": self._model,
            "messages": chat_messages(r.system, r.user),
            "temperature": r.temperature,
            "top_p": r.top_p,
        }
        if r.max_new_tokens is not None:  # unset: the server's default (vLLM: the rest of the context)
            payload["max_tokens"] = r.max_new_tokens
        if r.seed is not None:
            payload["seed"] = r.seed
        if self._extensions:
            extra: dict[str, Any] = {}
            thinking = r.thinking(self._enable_thinking)
            if thinking is not None:
                extra["chat_template_kwargs"] = chat_template_kwargs(enable_thinking=thinking)
            if r.top_k is not None:
                extra["top_k"] = r.top_k
            if extra:
                payload["extra_body"] = extra
        response = await self._create(payload)
        try:
            return str(response.choices[0].message.content or "")
        except (AttributeError, IndexError, TypeError) as e:
            raise EngineError(f"judge endpoint answered without a message: {str(response)[:300]}") from e

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[str]:
        return list(await asyncio.gather(*(self._gen(r) for r in requests)))

    async def health(self) -> Health:
        """``GET {base_url}/models`` answered (cached for a few seconds)."""
        import openai

        now = time.monotonic()
        if self._health is not None and now - self._health[0] < _HEALTH_TTL_S:
            return self._health[1]
        try:
            await self._client.with_options(timeout=2.0, max_retries=0).models.list()
            h = Health(True)
        except openai.APIStatusError as e:
            h = Health(False, f"judge endpoint {self._base_url}: GET /models: HTTP {e.status_code}")
        except openai.APIError as e:
            h = Health(False, f"judge endpoint {self._base_url} unreachable: {type(e).__name__}")
        self._health = (now, h)
        return h

    async def close(self) -> None:
        await self._client.close()
