"""Judge engine on an OpenAI-compatible endpoint (e.g. ``vllm serve`` of a large judge).

p_yes: ``POST {base_url}/chat/completions`` with ``max_tokens=1``, ``temperature=0``,
``logprobs=true`` and ``top_logprobs`` (default 20); the yes/no log-probs are folded over case
and space variants (``logsumexp``) and ``p_yes = sigmoid(l_yes - l_no)``.

When a side is absent from the top log-probs we never substitute a constant: a second request
restricts sampling to that side's token ids (``allowed_token_ids``, a vLLM server extension)
so that the sampled token IS that answer and its log-prob is returned. This needs the answer
token ids (``yes_token_ids`` / ``no_token_ids``; ``from_settings`` reads them from the model's
tokenizer when transformers can load it). If the side is still missing, or no ids are known,
:class:`BackendUnavailable` is raised.

Requests run concurrently under a semaphore (``max_concurrency``), each with a timeout and up
to ``max_retries`` retries on connection errors, timeouts, 429 and 5xx (exponential backoff).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from reward_server.backends.base import GenerationRequest, Health, JudgePrompt
from reward_server.backends.settings import OpenAIJudgeSettings
from reward_server.backends.yes_no import chat_messages, fold_by_text, p_yes
from reward_server.errors import BackendUnavailable, ModelLoadError

logger = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_HEALTH_TTL_S = 5.0


def judge_payload(model: str, prompt: JudgePrompt, *, top_logprobs: int) -> dict[str, Any]:
    """Request body for one yes/no judgment."""
    return {
        "model": model,
        "messages": chat_messages(prompt.system, prompt.prefix + prompt.suffix),
        "max_tokens": 1,
        "temperature": 0.0,
        "logprobs": True,
        "top_logprobs": top_logprobs,
    }


def response_entries(body: Any) -> list[tuple[str, float]]:
    """(token, logprob) of the first generated position: its top list and the sampled token."""
    try:
        first = body["choices"][0]["logprobs"]["content"][0]
        entries = [(str(e["token"]), float(e["logprob"])) for e in first.get("top_logprobs") or []]
        entries.append((str(first["token"]), float(first["logprob"])))
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise BackendUnavailable(f"judge endpoint answered without token logprobs ({e!r}): {str(body)[:300]}") from e
    seen: dict[str, float] = {}
    for tok, lp in entries:  # the sampled token usually repeats one of the top entries
        seen.setdefault(tok, lp)
    return list(seen.items())


class OpenAIJudge:
    """JudgeEngine over HTTP (see module doc)."""

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
        yes_token_ids: Sequence[int] = (),
        no_token_ids: Sequence[int] = (),
        backoff_s: float = 0.2,
    ) -> None:
        try:
            import httpx
        except ImportError as e:  # pragma: no cover - depends on the install
            raise ModelLoadError("the openai judge needs httpx: pip install 'reward-server[server]'") from e
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s)
        self._model = model
        self._sem = asyncio.Semaphore(max_concurrency)
        self._retries = max_retries
        self._top = top_logprobs
        self._ids = {"yes": list(yes_token_ids), "no": list(no_token_ids)}
        self._backoff = backoff_s
        self._health: tuple[float, Health] | None = None

    @classmethod
    def from_settings(cls, settings: OpenAIJudgeSettings) -> OpenAIJudge:
        yes: list[int] = []
        no: list[int] = []
        tokenizer = settings.tokenizer or settings.model
        try:  # best effort: the ids for the forcing request
            from transformers import AutoTokenizer

            from reward_server.backends.yes_no import yes_no_ids

            yes, no = yes_no_ids(AutoTokenizer.from_pretrained(tokenizer))
        except Exception as e:
            logger.warning("no local tokenizer %s (%s): a missing yes/no logprob will fail", tokenizer, e)
        return cls(
            settings.base_url,
            settings.model,
            api_key=os.environ.get(settings.api_key_env),
            max_concurrency=settings.max_concurrency,
            timeout_s=settings.request_timeout_s,
            max_retries=settings.max_retries,
            yes_token_ids=yes,
            no_token_ids=no,
        )

    @property
    def model_id(self) -> str:
        return self._model

    async def _post(self, path: str, payload: dict[str, Any]) -> Any:
        import httpx

        last = ""
        for attempt in range(self._retries + 1):
            if attempt:
                await asyncio.sleep(self._backoff * 2 ** (attempt - 1))
            try:
                async with self._sem:
                    resp = await self._client.post(path, json=payload)
            except httpx.HTTPError as e:  # connection errors and timeouts
                last = f"{type(e).__name__}: {e}"
                continue
            if resp.status_code in _RETRY_STATUS:
                last = f"HTTP {resp.status_code}: {resp.text[:200]}"
                continue
            if resp.status_code != 200:
                raise BackendUnavailable(
                    f"judge endpoint {self._client.base_url}{path} refused the request: "
                    f"HTTP {resp.status_code}: {resp.text[:300]}"
                )
            return resp.json()
        raise BackendUnavailable(
            f"judge endpoint {self._client.base_url}{path} failed after {self._retries + 1} attempts: {last}"
        )

    async def _one(self, prompt: JudgePrompt) -> float:
        payload = judge_payload(self._model, prompt, top_logprobs=self._top)
        l_yes, l_no = fold_by_text(response_entries(await self._post("/chat/completions", payload)))
        found = {"yes": l_yes, "no": l_no}
        for side in ("yes", "no"):
            if found[side] is not None:
                continue
            if not self._ids[side]:
                raise BackendUnavailable(
                    f"judge endpoint gave no logprob for {side!r} in its top {self._top} and the answer "
                    "token ids are unknown (give yes_token_ids/no_token_ids or a judge.model with a "
                    "local tokenizer)"
                )
            forced = dict(payload, allowed_token_ids=self._ids[side])
            found[side] = fold_by_text(response_entries(await self._post("/chat/completions", forced)))[
                0 if side == "yes" else 1
            ]
            if found[side] is None:
                raise BackendUnavailable(
                    f"judge endpoint gave no logprob for {side!r} even when restricted to its tokens"
                )
        assert found["yes"] is not None and found["no"] is not None
        return p_yes(found["yes"], found["no"])

    async def p_yes(self, prompts: Sequence[JudgePrompt]) -> list[float]:
        return list(await asyncio.gather(*(self._one(p) for p in prompts)))

    async def _gen(self, r: GenerationRequest) -> str:
        payload: dict[str, Any] = {
            "model": self._model,
            "messages": chat_messages(r.system, r.user),
            "max_tokens": r.max_new_tokens,
            "temperature": r.temperature,
            "top_p": r.top_p,
        }
        if r.seed is not None:
            payload["seed"] = r.seed
        body = await self._post("/chat/completions", payload)
        try:
            return str(body["choices"][0]["message"]["content"] or "")
        except (KeyError, IndexError, TypeError) as e:
            raise BackendUnavailable(f"judge endpoint answered without a message: {str(body)[:300]}") from e

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[str]:
        return list(await asyncio.gather(*(self._gen(r) for r in requests)))

    async def health(self) -> Health:
        """``GET {base_url}/models`` answered 200 (cached for a few seconds)."""
        import httpx

        now = time.monotonic()
        if self._health is not None and now - self._health[0] < _HEALTH_TTL_S:
            return self._health[1]
        try:
            resp = await self._client.get("/models", timeout=2.0)
            h = Health(resp.status_code == 200, f"GET /models: HTTP {resp.status_code}")
        except httpx.HTTPError as e:
            h = Health(False, f"judge endpoint {self._client.base_url} unreachable: {type(e).__name__}")
        self._health = (now, Health(h.ok, "" if h.ok else h.detail))
        return self._health[1]

    async def close(self) -> None:
        await self._client.aclose()
