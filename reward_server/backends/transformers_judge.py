"""Judge engine on a transformers causal LM, with an explicit prefix KV cache.

p_yes is exact: the next-token logits after the rendered chat prompt, folded over the answer
tokens of :mod:`reward_server.backends.yes_no` under ``p_yes_readout``: ``l_yes =
logsumexp(logits[yes ids])``, ``p_yes = sigmoid(l_yes - l_no)``; with the released read-out (one
id per side) that is ``P(yes) / (P(yes) + P(no))`` over the lowercase tokens.

Prefix sharing: the chat-rendered prompt is split right after ``JudgePrompt.prefix`` (system
message + context + text). Each distinct prefix is run once; its KV is kept in a bounded LRU
(``prefix_cache_size``) so the rollouts of a GRPO group reuse it across calls, and all the
rules' suffixes are run as one right-padded batch against a copy of that KV, reading the
logits at each suffix's last real token. The ids are always those of the whole rendered prompt,
``tokens(prefix + suffix)``, as a vLLM server tokenizes it: each suffix is tokenized together
with the prefix's last :data:`BOUNDARY_TOKENS` tokens, and where the two merge across the split
(a rule starting with two newlines or two spaces) the prompt shares only the prefix tokens its
own tokenization keeps (:meth:`TransformersJudge.prompt_ids`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from reward_server.backends.base import GenerationRequest, Health, JudgePrompt
from reward_server.backends.settings import TransformersJudgeSettings
from reward_server.backends.torch_device import resolve_device, resolve_dtype, set_threads
from reward_server.backends.yes_no import DEFAULT_READOUT, PYesReadout, render_chat, yes_no_ids
from reward_server.errors import ConfigError, ModelLoadError, engine_failure

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

_PLACEHOLDER = "\ue000REWARD_SERVER_USER_TURN\ue001"
BOUNDARY_TOKENS = 8  # prefix tokens re-tokenized with each suffix to check the split


@dataclass(frozen=True)
class _Prefix:
    """A rendered prefix's ids and KV, and its last ``tail_tokens`` tokens as text (``tail``)."""

    ids: list[int]
    kv: Any
    tail: str
    tail_tokens: int


@dataclass
class JudgeStats:
    """Work counters (for benchmarks and logs)."""

    prefilled_tokens: int = 0  # tokens run through the model (prefixes + suffixes, unpadded)
    prefix_hits: int = 0
    prefix_misses: int = 0
    forward_calls: int = 0
    extra: dict[str, int] = field(default_factory=dict)


class TransformersJudge:
    """JudgeEngine on a local or HF-hub causal LM (see module doc)."""

    def __init__(
        self,
        model: str,
        *,
        device: str = "auto",
        dtype: str = "auto",
        forward_batch_size: int = 32,
        prefix_cache_size: int = 64,
        seed: int = 0,
        model_id: str | None = None,
        enable_thinking: bool = False,
        p_yes_readout: PYesReadout = DEFAULT_READOUT,
    ) -> None:
        try:
            import torch  # noqa: F401  (checked here, for the message below)
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as e:
            raise ModelLoadError(
                f"the transformers judge needs torch and transformers ({e}): pip install 'reward-server[server]'"
            ) from e
        self._device = resolve_device(device)
        try:
            tok: Any = AutoTokenizer.from_pretrained(model)
            loaded: Any = AutoModelForCausalLM.from_pretrained(model, dtype=resolve_dtype(dtype, self._device))
            loaded = loaded.to(self._device)
        except Exception as e:
            raise ModelLoadError(f"could not load judge model {model!r}: {type(e).__name__}: {e}") from e
        self._attach(
            loaded, tok, forward_batch_size=forward_batch_size, prefix_cache_size=prefix_cache_size,
            seed=seed, model_id=model_id or model, enable_thinking=enable_thinking, p_yes_readout=p_yes_readout,
        )  # fmt: skip

    def _attach(
        self, model: Any, tokenizer: Any, *, forward_batch_size: int, prefix_cache_size: int, seed: int, model_id: str,
        enable_thinking: bool = False, p_yes_readout: PYesReadout = DEFAULT_READOUT,
    ) -> None:
        import torch

        self._enable_thinking = enable_thinking
        self.p_yes_readout = p_yes_readout
        self._tok: Any = tokenizer
        self._model: Any = model
        self._device = str(next(model.parameters()).device)
        self._model.eval()
        self._base = self._model.base_model
        self._head = self._model.get_output_embeddings()
        self._softcap = getattr(self._model.config, "final_logit_softcapping", None)
        yes, no = yes_no_ids(self._tok, p_yes_readout)
        self._yes = torch.tensor(yes, device=self._device)
        self._no = torch.tensor(no, device=self._device)
        self._pad = self._tok.pad_token_id
        if self._pad is None:
            self._pad = self._tok.eos_token_id if self._tok.eos_token_id is not None else 0
        self._max_batch = forward_batch_size
        self._cache_size = prefix_cache_size
        self._cache: OrderedDict[str, _Prefix] = OrderedDict()
        self._templates: dict[str, tuple[str, str]] = {}
        self._seed = seed
        self._lock = threading.Lock()
        self._model_id = model_id
        self._closed = False
        self.stats = JudgeStats()
        logger.info(
            "transformers judge %s on %s: p_yes read-out %s, yes ids %s, no ids %s",
            self._model_id,
            self._device,
            p_yes_readout,
            self._yes.tolist(),
            self._no.tolist(),
        )

    @classmethod
    def from_model(
        cls,
        model: Any,
        tokenizer: Any,
        *,
        model_id: str,
        forward_batch_size: int = 32,
        prefix_cache_size: int = 64,
        seed: int = 0,
        enable_thinking: bool = False,
        p_yes_readout: PYesReadout = DEFAULT_READOUT,
    ) -> TransformersJudge:
        """A judge over an already built causal LM and its tokenizer (benchmarks with
        random-weight models built on the device); the model stays on its device and dtype."""
        judge = cls.__new__(cls)
        judge._attach(
            model, tokenizer, forward_batch_size=forward_batch_size, prefix_cache_size=prefix_cache_size,
            seed=seed, model_id=model_id, enable_thinking=enable_thinking, p_yes_readout=p_yes_readout,
        )  # fmt: skip
        return judge

    @classmethod
    def from_settings(cls, settings: TransformersJudgeSettings, *,
                      load_from: str | None = None) -> TransformersJudge:
        """``load_from``: a folder to load ``settings.model`` from (its cached copy), whose name
        the judge still reports."""
        from reward_server.backends.smollm2 import resolve_model

        set_threads(settings.num_threads)
        model, model_id = (load_from, settings.model) if load_from else resolve_model(settings.model)
        return cls(
            model,
            device=settings.device,
            dtype=settings.dtype,
            forward_batch_size=settings.forward_batch_size,
            prefix_cache_size=settings.prefix_cache_size,
            seed=settings.seed,
            model_id=model_id,
            enable_thinking=settings.enable_thinking,
            p_yes_readout=settings.p_yes_readout,
        )

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def tokenizer(self) -> Any:
        return self._tok

    # ------------------------------------------------------------------ rendering
    def _chat(self, system: str, user: str) -> str:
        return render_chat(self._tok, system, user, enable_thinking=self._enable_thinking)

    def render(self, prompt: JudgePrompt) -> tuple[str, str]:
        """(prefix, suffix) strings of the chat-rendered prompt, split after ``prompt.prefix``."""
        parts = self._templates.get(prompt.system)
        if parts is None:
            head, sep, tail = self._chat(prompt.system, _PLACEHOLDER).partition(_PLACEHOLDER)
            if not sep:
                raise ModelLoadError("the judge chat template drops the user message")
            parts = (head, tail)
            if self._chat(prompt.system, prompt.prefix + prompt.suffix) != (
                head + prompt.prefix + prompt.suffix + tail
            ):
                raise ModelLoadError("the judge chat template rewrites the user message")
            self._templates[prompt.system] = parts
        return parts[0] + prompt.prefix, prompt.suffix + parts[1]

    def prompt_lengths(self, prompt: JudgePrompt) -> tuple[str, int, int]:
        """(rendered prefix, its token count, the suffix's token count): what the two paths
        prefill for ``prompt`` (benchmarks count work with it without running the model)."""
        prefix, suffix = self.render(prompt)
        return prefix, len(self._ids(prefix)), len(self._ids(suffix))

    def _ids(self, text: str) -> list[int]:
        ids: list[int] = self._tok(text, add_special_tokens=False)["input_ids"]
        return ids

    # ------------------------------------------------------------------ scoring
    async def p_yes(self, prompts: Sequence[JudgePrompt]) -> list[float]:
        return await asyncio.to_thread(self.p_yes_sync, prompts)

    def p_yes_sync(self, prompts: Sequence[JudgePrompt], *, share_prefix: bool = True) -> list[float]:
        """Blocking p_yes; ``share_prefix=False`` runs each full prompt on its own (baseline)."""
        import torch

        with self._lock, torch.inference_mode():
            try:
                if share_prefix:
                    return self._score_shared(prompts)
                return self._score_full(prompts)
            except Exception as e:  # out of memory / device: UNAVAILABLE; a bug: INTERNAL
                raise engine_failure(e, f"judge {self._model_id}") from e

    def _p_from_hidden(self, hidden: torch.Tensor) -> list[float]:
        import torch

        logits = self._head(hidden).float()
        if self._softcap:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        l_yes = torch.logsumexp(logits[:, self._yes], dim=-1)
        l_no = torch.logsumexp(logits[:, self._no], dim=-1)
        out: list[float] = torch.sigmoid(l_yes - l_no).tolist()
        return out

    def _prefix_kv(self, prefix: str) -> _Prefix:
        import torch

        hit = self._cache.get(prefix)
        if hit is not None:
            self._cache.move_to_end(prefix)
            self.stats.prefix_hits += 1
            return hit
        enc = self._tok(prefix, add_special_tokens=False, return_offsets_mapping=True)
        ids: list[int] = enc["input_ids"]
        out = self._base(input_ids=torch.tensor([ids], device=self._device), use_cache=True)
        kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        self.stats.prefix_misses += 1
        self.stats.prefilled_tokens += len(ids)
        self.stats.forward_calls += 1
        k = min(BOUNDARY_TOKENS, len(ids))
        tail_at = enc["offset_mapping"][len(ids) - k][0] if k else len(prefix)
        entry = _Prefix(ids, kv, prefix[tail_at:], k)
        if self._cache_size > 0:
            self._cache[prefix] = entry
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return entry

    def prompt_ids(self, prefix: str, suffix: str, pre: _Prefix) -> tuple[int, list[int]]:
        """(how many of the prefix's tokens the prompt keeps, the ids after them): together
        exactly ``tokens(prefix + suffix)``. The suffix is tokenized after the prefix's last
        tokens; if those come back unchanged the split falls on a token boundary and the whole
        prefix is kept, otherwise the whole prompt is tokenized and the common ids are kept."""
        window = self._ids(pre.tail + suffix)
        if window[: pre.tail_tokens] == pre.ids[len(pre.ids) - pre.tail_tokens :]:
            return len(pre.ids), window[pre.tail_tokens :]
        whole = self._ids(prefix + suffix)
        keep = 0
        for a, b in zip(whole, pre.ids, strict=False):
            if a != b:
                break
            keep += 1
        self.stats.extra["boundary_retokenized"] = self.stats.extra.get("boundary_retokenized", 0) + 1
        return keep, whole[keep:]

    def _score_shared(self, prompts: Sequence[JudgePrompt]) -> list[float]:
        import torch
        from transformers import DynamicCache

        groups: OrderedDict[tuple[str, int], list[tuple[int, list[int]]]] = OrderedDict()
        whole: list[tuple[int, list[int]]] = []
        prefixes: dict[str, _Prefix] = {}  # one cache lookup (or prefill) per distinct prefix
        for i, p in enumerate(prompts):
            prefix, suffix = self.render(p)
            pre = prefixes.get(prefix)
            if pre is None:
                pre = prefixes[prefix] = self._prefix_kv(prefix)
            keep, rest = self.prompt_ids(prefix, suffix, pre)
            if keep and rest:
                groups.setdefault((prefix, keep), []).append((i, rest))
            else:  # nothing to share (or nothing after the prefix): run the prompt whole
                whole.append((i, self._ids(prefix + suffix)))
        result = [0.0] * len(prompts)
        self._run_whole(whole, result)
        for (prefix, plen), members in groups.items():
            pre = prefixes[prefix]
            kv = pre.kv if plen == len(pre.ids) else [(k[:, :, :plen], v[:, :, :plen]) for k, v in pre.kv]
            members.sort(key=lambda m: len(m[1]))
            for start in range(0, len(members), self._max_batch):
                chunk = members[start : start + self._max_batch]
                n = len(chunk)
                # built on the host, one copy each to the device (not one per row)
                width = max(len(s) for _, s in chunk)
                ids_h = torch.full((n, width), self._pad, dtype=torch.long)
                mask_h = torch.zeros((n, plen + width), dtype=torch.long)
                mask_h[:, :plen] = 1
                for row, (_, s) in enumerate(chunk):
                    ids_h[row, : len(s)] = torch.tensor(s)
                    mask_h[row, plen : plen + len(s)] = 1
                lens = torch.tensor([len(s) for _, s in chunk]).to(self._device)
                ids, mask = ids_h.to(self._device), mask_h.to(self._device)
                # A fresh cache per batch: update() concatenates into new tensors, so the
                # cached prefix KV is never written to.
                cache = DynamicCache(
                    ddp_cache_data=[(k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1)) for k, v in kv],
                    config=self._model.config,
                )
                pos = torch.arange(plen, plen + width, device=self._device).expand(n, width)
                out = self._base(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=pos,
                    past_key_values=cache,
                    use_cache=True,
                )
                hidden = out.last_hidden_state[torch.arange(n, device=self._device), lens - 1]
                for (i, _), prob in zip(chunk, self._p_from_hidden(hidden), strict=True):
                    result[i] = prob
                self.stats.prefilled_tokens += int(lens.sum())
                self.stats.forward_calls += 1
        return result

    def _score_full(self, prompts: Sequence[JudgePrompt]) -> list[float]:
        seqs = []
        for i, p in enumerate(prompts):
            prefix, suffix = self.render(p)
            seqs.append((i, self._ids(prefix + suffix)))
        result = [0.0] * len(prompts)
        self._run_whole(seqs, result)
        return result

    def _run_whole(self, seqs: list[tuple[int, list[int]]], result: list[float]) -> None:
        """p_yes of whole prompts (index, ids) into ``result``, right-padded batches."""
        import torch

        seqs = sorted(seqs, key=lambda m: len(m[1]))
        for start in range(0, len(seqs), self._max_batch):
            chunk = seqs[start : start + self._max_batch]
            n = len(chunk)
            width = max(len(s) for _, s in chunk)
            ids_h = torch.full((n, width), self._pad, dtype=torch.long)
            mask_h = torch.zeros((n, width), dtype=torch.long)
            for row, (_, s) in enumerate(chunk):
                ids_h[row, : len(s)] = torch.tensor(s)
                mask_h[row, : len(s)] = 1
            lens = torch.tensor([len(s) for _, s in chunk]).to(self._device)
            ids, mask = ids_h.to(self._device), mask_h.to(self._device)
            out = self._base(input_ids=ids, attention_mask=mask, use_cache=False)
            hidden = out.last_hidden_state[torch.arange(n, device=self._device), lens - 1]
            for (i, _), prob in zip(chunk, self._p_from_hidden(hidden), strict=True):
                result[i] = prob
            self.stats.prefilled_tokens += int(lens.sum())
            self.stats.forward_calls += 1

    def clear_prefix_cache(self) -> None:
        with self._lock:
            self._cache.clear()

    # ------------------------------------------------------------------ generation
    async def generate(self, requests: Sequence[GenerationRequest]) -> list[str]:
        return await asyncio.to_thread(self.generate_sync, requests)

    def generate_sync(self, requests: Sequence[GenerationRequest]) -> list[str]:
        import torch

        outs: list[str] = []
        with self._lock, torch.inference_mode():
            for r in requests:
                text = render_chat(self._tok, r.system, r.user, enable_thinking=r.thinking(self._enable_thinking))
                ids = torch.tensor([self._ids(text)], device=self._device)
                torch.manual_seed(self._seed if r.seed is None else r.seed)
                sample = r.temperature > 0
                budget = self._new_tokens(r, ids.shape[1])
                try:
                    gen = self._model.generate(
                        input_ids=ids,
                        attention_mask=torch.ones_like(ids),
                        max_new_tokens=budget,
                        do_sample=sample,
                        temperature=r.temperature if sample else None,
                        top_p=r.top_p if sample else None,
                        top_k=r.top_k if sample else None,
                        pad_token_id=self._pad,
                    )
                except Exception as e:
                    raise engine_failure(e, f"generation on {self._model_id}") from e
                outs.append(self._tok.decode(gen[0, ids.shape[1] :], skip_special_tokens=True))
        return outs

    def _new_tokens(self, request: GenerationRequest, prompt_tokens: int) -> int:
        """``max_new_tokens``, or (None) what is left of the model's context after the prompt,
        as a vLLM server gives a request without ``max_tokens``."""
        if request.max_new_tokens is not None:
            return request.max_new_tokens
        context = getattr(self._model.config, "max_position_embeddings", None)
        if not isinstance(context, int) or context <= prompt_tokens:
            raise ConfigError(
                f"judge {self._model_id}: no token budget for generation (max_new_tokens unset and the "
                f"model's context {context!r} does not exceed the {prompt_tokens}-token prompt); set "
                "rubric.generation_max_new_tokens"
            )
        return context - prompt_tokens

    async def health(self) -> Health:
        if self._closed:
            return Health(False, f"judge {self._model_id} is closed")
        return Health(True)

    async def close(self) -> None:
        self._closed = True
        self.clear_prefix_cache()
