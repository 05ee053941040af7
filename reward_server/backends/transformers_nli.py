"""NLI cross-encoder on transformers: length-sorted buckets, per-bucket padding, token budget.

S_ent is the softmax over the model's labels, read at the label *named* entailment in the
model config (``id2label``; case-insensitive). A model whose labels carry no names (``LABEL_0``
...) is refused at load time: guessing the column would silently score the wrong class.

Throughput: pairs are tokenized once, sorted by length and cut into batches whose padded size
(rows x longest row) stays under ``token_budget``; each batch is padded only to its own longest
row. ``inference_mode``; bf16 on GPU; optional int8 dynamic quantization of Linear layers on CPU.
Pairs longer than ``max_length`` are cut on the premise side (``only_first``; the hypothesis
is kept whole) and reported as truncated.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from typing import Any

from reward_server.backends.base import Health, NLIPair, NLIScore
from reward_server.backends.settings import TransformersNLISettings
from reward_server.backends.torch_device import resolve_device, resolve_dtype, set_threads
from reward_server.errors import ModelLoadError, engine_failure

logger = logging.getLogger(__name__)

CPU_TOKEN_BUDGET = 1024  # padded tokens per batch on CPU: best of 512/1024/2048/4096 in bench/nli_throughput.py
GPU_TOKEN_BUDGET = 65536  # padded tokens per batch on GPU


def entailment_index(id2label: dict[int, str] | dict[str, str], *, model_id: str) -> int:
    """Index of the label named ``entailment`` (case-insensitive); ModelLoadError otherwise."""
    labels = {int(k): str(v) for k, v in id2label.items()}
    hits = [i for i, name in labels.items() if name.strip().lower() == "entailment"]
    if len(hits) == 1:
        return hits[0]
    raise ModelLoadError(
        f"NLI model {model_id!r} has labels {labels}; none (or several) is named 'entailment', "
        "so the entailment column cannot be found. Use a 3-way NLI checkpoint whose config.json "
        'names its labels (e.g. "id2label": {"0": "contradiction", "1": "entailment", '
        '"2": "neutral"}), or fix id2label/label2id in its config.json.'
    )


def make_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Indices sorted by length, cut so that rows x longest row <= token_budget (>= 1 row)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and (len(current) + 1) * lengths[i] > token_budget:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


class TransformersNLI:
    """A sequence-classification NLI model behind the :class:`NLIEngine` protocol."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        model_id: str,
        max_length: int = 512,
        token_budget: int | None = None,
    ) -> None:
        import torch

        self._model = model.eval()
        self._tok = tokenizer
        self._model_id = model_id
        self._device = (
            next(model.parameters()).device
            if any(True for _ in model.parameters())
            else torch.device("cpu")
        )
        tok_max = getattr(tokenizer, "model_max_length", None)
        self._max_length = (
            min(max_length, tok_max) if tok_max and tok_max < 1_000_000 else max_length
        )
        self._ent = entailment_index(model.config.id2label, model_id=model_id)
        if len(model.config.id2label) != 3:
            logger.warning(
                "NLI model %s has %d labels, not 3", model_id, len(model.config.id2label)
            )
        gpu = self._device.type == "cuda"
        self._budget = token_budget or (GPU_TOKEN_BUDGET if gpu else CPU_TOKEN_BUDGET)
        self._budget = max(self._budget, self._max_length)
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._lock = threading.Lock()
        logger.info(
            "NLI model %s on %s: entailment index %d, max_length %d, token budget %d",
            model_id,
            self._device,
            self._ent,
            self._max_length,
            self._budget,
        )

    @classmethod
    def from_settings(cls, settings: TransformersNLISettings, *,
                      load_from: str | None = None) -> TransformersNLI:
        """Load ``settings.model`` (HF id or local folder; ``load_from``: a folder to load it from
        instead, its cached copy) on the configured device and dtype."""
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        set_threads(settings.num_threads)
        device = resolve_device(settings.device)
        on_gpu = device.startswith("cuda")
        dtype = resolve_dtype(settings.dtype, device)
        try:
            source = load_from or settings.model
            tokenizer = AutoTokenizer.from_pretrained(source)
            model = AutoModelForSequenceClassification.from_pretrained(source, dtype=dtype)
        except (OSError, ValueError) as e:
            raise ModelLoadError(
                f"cannot load NLI model {settings.model!r}: {e}. Give nli_engine.model as a "
                "Hugging Face id reachable from this machine or a local folder holding "
                "config.json, the weights and the tokenizer files."
            ) from e
        entailment_index(model.config.id2label, model_id=settings.model)  # fail before moving
        model = model.to(device)
        if settings.quantize_int8:
            if on_gpu:
                logger.warning("quantize_int8 is CPU-only; ignored on %s", device)
            else:
                quantize: Any = torch.ao.quantization.quantize_dynamic
                model = quantize(model, {torch.nn.Linear}, dtype=torch.qint8)
        return cls(
            model,
            tokenizer,
            model_id=settings.model,
            max_length=settings.max_length,
            token_budget=settings.token_budget,
        )

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def token_budget(self) -> int:
        return self._budget

    def token_counts_sync(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        enc = self._tok(list(texts), add_special_tokens=False, verbose=False)
        return [len(ids) for ids in enc["input_ids"]]

    async def token_counts(self, texts: Sequence[str]) -> list[int]:
        return self.token_counts_sync(texts)

    def _encode(self, pairs: Sequence[NLIPair]) -> tuple[list[dict[str, list[int]]], list[bool]]:
        prem = [p.premise for p in pairs]
        hyp = [p.hypothesis for p in pairs]
        enc = self._tok(prem, hyp, truncation=False, verbose=False)
        keys = [k for k in ("input_ids", "token_type_ids", "attention_mask") if k in enc]
        rows = [{k: list(enc[k][i]) for k in keys} for i in range(len(pairs))]
        truncated = [len(r["input_ids"]) > self._max_length for r in rows]
        for i in (i for i, t in enumerate(truncated) if t):
            for strategy in ("only_first", "longest_first"):
                one = self._tok(
                    prem[i], hyp[i], truncation=strategy, max_length=self._max_length, verbose=False
                )
                if len(one["input_ids"]) <= self._max_length:
                    break
            rows[i] = {k: list(one[k]) for k in keys}
        return rows, truncated

    def _score_sync(self, pairs: Sequence[NLIPair]) -> list[NLIScore]:
        import torch

        with self._lock:
            rows, truncated = self._encode(pairs)
            probs = [0.0] * len(pairs)
            lengths = [len(r["input_ids"]) for r in rows]
            for batch in make_batches(lengths, self._budget):
                width = max(lengths[i] for i in batch)
                tensors: dict[str, Any] = {}
                for key in rows[batch[0]]:
                    fill = self._pad_id if key == "input_ids" else 0
                    data = [rows[i][key] + [fill] * (width - lengths[i]) for i in batch]
                    tensors[key] = torch.tensor(data, dtype=torch.long, device=self._device)
                with torch.inference_mode():
                    logits = self._model(**tensors).logits.float()
                p = torch.softmax(logits, dim=-1)[:, self._ent].tolist()
                for i, v in zip(batch, p, strict=True):
                    probs[i] = float(v)
        return [NLIScore(p, t) for p, t in zip(probs, truncated, strict=True)]

    async def entailment(self, pairs: Sequence[NLIPair]) -> list[NLIScore]:
        if not pairs:
            return []
        try:
            return await asyncio.to_thread(self._score_sync, list(pairs))
        except Exception as e:  # out of memory / device: UNAVAILABLE; a bug: INTERNAL
            raise engine_failure(
                e, f"NLI model {self._model_id} on {len(pairs)} pairs (out of memory? lower "
                "engines.nli.token_budget)"
            ) from e

    async def health(self) -> Health:
        if self._model is None:
            return Health(False, f"NLI model {self._model_id} is closed")
        return Health(True)

    async def close(self) -> None:
        with self._lock:
            self._model = None
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except Exception:  # pragma: no cover - best effort
            logger.debug("empty_cache failed", exc_info=True)
