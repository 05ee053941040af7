"""Request limits and semantic validation: what one request may carry, and what it will cost.

This is the one place a request's counts are checked and its defaults ("0 means the server
default") resolved: :class:`Validator` turns a Score batch into a :class:`ValidatedBatch` (what
:meth:`reward_server.service.RewardService.score` takes) and an InduceRubrics call into an
:class:`Induction`; each kind's own rules come from :mod:`reward_server.kinds`.

Every cap is checked before any message is built from the offending value, and messages quote
callers' values only through :func:`reward_server.errors.quote` (a bounded excerpt), so an error
can never grow past the size of gRPC trailers. :meth:`Validator.items` works through a batch
item by item with :func:`reward_server.cooperative.turn` between items, so validating the
largest request allowed never holds the event loop for long.

The cost of a request is counted in *judgments*: the judge prompts and NLI pairs it will send to
the engines, estimated from its shape (an upper bound where the shape leaves it open, e.g. PARL
counts ``rubric.max_rules`` rules). Admission control (:mod:`reward_server.service.admission`) counts
the same unit.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from reward_server import cooperative, kinds
from reward_server import domain as d
from reward_server.errors import InvalidRequest, quote
from reward_server.nli.settings import NLISettings
from reward_server.rubric.settings import RubricSettings

_SENTENCE_END = re.compile(r"[.!?](?:\s|$)")


class Limits(BaseModel):
    """What one request may carry; more is refused with INVALID_ARGUMENT naming the field."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_batch_items: int = Field(1024, ge=1, description="Most items one Score call may carry.")
    max_text_bytes: int = Field(
        32768, ge=1, description="Longest text field (UTF-8 bytes) a request may carry; a "
        "longer policy output (text, policy_output, response) is POLICY_INVALID instead."
    )
    max_id_bytes: int = Field(256, ge=1, description="Longest item id (UTF-8 bytes).")
    max_rules_per_item: int = Field(64, ge=1, description="Most rules of one rubric_score item.")
    max_history_items: int = Field(
        64, ge=1, description="Most history items of one parl_reward item or InduceRubrics call "
        "(only the last rubric.history_limit are judged)."
    )
    max_baselines: int = Field(16, ge=1, description="Most baselines of one parl_reward item.")
    max_weighted_parts: int = Field(8, ge=1, description="Most parts of one weighted item.")
    max_item_bytes: int = Field(
        2 * 1024 * 1024, ge=1024, description="Largest encoded ScoreItem (bytes on the wire); "
        "checked before the item is parsed."
    )
    max_judgments_per_request: int = Field(
        65536, ge=1, description="Most judgments (judge prompts plus NLI pairs, estimated from "
        "the request's shape) one call may need."
    )


def utf8_len(value: str, limit: int) -> int:
    """The UTF-8 length of ``value``, or any number above ``limit`` once it is known to be over
    (without encoding long strings when the character count already decides)."""
    n = len(value)
    if value.isascii() or n > limit:
        return n
    return n if n * 4 <= limit else len(value.encode("utf-8"))


def _sentences(text: str) -> int:
    return max(1, len(_SENTENCE_END.findall(text)))


class Validator:
    """Checks requests against :class:`Limits` and estimates their judgments (the
    :class:`reward_server.kinds.Checks` each kind's validation uses)."""

    def __init__(self, limits: Limits, rubric: RubricSettings, nlicv: NLISettings) -> None:
        self.limits = limits
        self.rubric = rubric
        self.nlicv = nlicv

    # ------------------------------------------------------------------ pieces
    def text(self, value: str, where: str, *, required: bool = True) -> None:
        limit = self.limits.max_text_bytes
        n = utf8_len(value, limit)
        if n > limit:
            raise InvalidRequest(
                f"{where}: {n} bytes exceed service.limits.max_text_bytes={limit}"
            )
        if required and not value.strip():
            raise InvalidRequest(f"{where}: must not be empty")

    def policy_text_problem(self, value: str, field: str) -> str | None:
        """Why a policy output is unusable (empty or too long), else None."""
        if not value.strip():
            return f"{field} is empty"
        limit = self.limits.max_text_bytes
        n = utf8_len(value, limit)
        return f"{field} has {n} bytes, over {limit}" if n > limit else None

    def count(self, n: int, name: str, where: str) -> None:
        """Refuse ``n`` entries at ``where`` if over the limit called ``name``."""
        limit: int = getattr(self.limits, name)
        if n > limit:
            raise InvalidRequest(
                f"{where}: {n} entries exceed service.limits.{name}={limit}; send fewer"
            )

    def history(self, items: Sequence[d.HistoryItem], where: str) -> None:
        if not items:
            raise InvalidRequest(f"{where}: needs at least one (context, text) item")
        self.count(len(items), "max_history_items", where)
        for k, h in enumerate(items):
            self.text(h.context, f"{where}[{k}].context", required=False)
            self.text(h.text, f"{where}[{k}].text")

    def _judged_history(self, n: int) -> int:
        return min(n, self.rubric.history_limit)

    # -------------------------------------------------------------------- Score
    def spec(self, spec: d.ItemSpec, where: str) -> kinds.Work:
        """Validate one item spec with its kind's rules (:mod:`reward_server.kinds`); its
        work (judge prompts and NLI pairs)."""
        kind = kinds.of(spec)
        return kind.validate(spec, self, f"{where}.{kind.proto_field}")

    def item(self, item: d.ScoreItem, index: int, seen: dict[str, int]) -> kinds.Work:
        """Validate one item of a batch (``seen``: ids so far -> index); its work."""
        limit = self.limits.max_id_bytes
        n = utf8_len(item.item_id, limit)
        if n > limit:
            raise InvalidRequest(
                f"items[{index}].id: {n} bytes exceed service.limits.max_id_bytes={limit}"
            )
        first = seen.setdefault(item.item_id, index)
        if first != index:
            raise InvalidRequest(
                f"items[{index}].id: duplicate id {quote(item.item_id)} (also items[{first}]); "
                "ids must be unique within a request"
            )
        return self.spec(item.spec, f"items[{index}] (id {quote(item.item_id)})")

    def batch_size(self, n: int) -> None:
        limit = self.limits.max_batch_items
        if n == 0:
            raise InvalidRequest("items: the batch is empty; send at least one item")
        if n > limit:
            raise InvalidRequest(
                f"items: {n} items exceed service.limits.max_batch_items={limit}; "
                "split the batch or raise the limit"
            )

    def total(self, judgments: int, what: str) -> int:
        limit = self.limits.max_judgments_per_request
        if judgments > limit:
            raise InvalidRequest(
                f"{what}: needs about {judgments} judgments (judge prompts and NLI pairs), over "
                f"service.limits.max_judgments_per_request={limit}; split the request"
            )
        return judgments

    def largest_request_bytes(self, field_overhead: int) -> dict[str, int]:
        """No valid InduceRubrics or Verify request is larger than this many bytes
        (``field_overhead``: the encoding's bytes per field, generously)."""
        lim = self.limits
        text = lim.max_text_bytes + field_overhead
        return {
            "InduceRubrics": lim.max_history_items * (2 * text + field_overhead) + 64,
            "Verify": 3 * text + 16,
        }

    def batch(self) -> BatchCheck:
        """A Score batch checked item by item as it arrives (see :class:`BatchCheck`)."""
        return BatchCheck(self)

    async def items(self, items: Sequence[d.ScoreItem]) -> ValidatedBatch:
        """Validate a Score batch, yielding the loop between items."""
        check = self.batch()
        check.size(len(items))
        for i, item in enumerate(items):
            await cooperative.turn()
            check.item(item, i)
        return check.done(items)

    # ------------------------------------------------------ Verify, InduceRubrics
    def verify(self, *, response: str, answer: str, preference: str, evidence: bool) -> int:
        self.text(response, "response")
        self.text(answer, "answer")
        self.text(preference, "preference")
        if not evidence:
            return 2
        m = _sentences(response)
        work = sum(1 + m + n + m * n for n in (_sentences(answer), _sentences(preference)))
        return self.total(work, "evidence")

    def induce(self, history: Sequence[d.HistoryItem], *, num_samples: int) -> Induction:
        """Validate an InduceRubrics call; ``num_samples`` 0 means ``rubric.induction_samples``
        (resolved here, the one place)."""
        self.history(history, "history")
        if num_samples < 0 or num_samples > 64:
            raise InvalidRequest(f"num_samples: {num_samples} is outside 0..64 (0 = server default)")
        k = num_samples or self.rubric.induction_samples
        judgments = self.total(
            k * (1 + self.rubric.max_rules * self._judged_history(len(history))), "history")
        return Induction(samples=k, judgments=judgments)


@dataclass(frozen=True)
class ValidatedBatch:
    """A Score batch that passed :class:`Validator` (made only by :meth:`Validator.items` and
    :meth:`BatchCheck.done`): every item checked against the limits, its judgments counted."""

    items: tuple[d.ScoreItem, ...]
    judgments: int
    item_judgments: tuple[int, ...]  # each item's, in order (they sum to ``judgments``)
    nli_pairs: int = 0  # of ``judgments``, the NLI pairs (the rest are judge prompts)


@dataclass(frozen=True)
class Induction:
    """A validated InduceRubrics call: the samples to draw (the default resolved) and its
    judgments."""

    samples: int
    judgments: int


class BatchCheck:
    """One Score batch validated as it is converted: :meth:`size` sees the item count before
    any item is parsed, :meth:`item` each item as soon as it is converted (so a bad item is
    refused before the rest is parsed), :meth:`done` the whole batch."""

    def __init__(self, validator: Validator) -> None:
        self._validator = validator
        self._seen: dict[str, int] = {}
        self._per_item: list[int] = []
        self._nli = 0
        self._count: int | None = None
        self.max_items = validator.limits.max_batch_items
        self.max_item_bytes = validator.limits.max_item_bytes

    def size(self, n: int) -> None:
        self._validator.batch_size(n)
        self._count = n
        self._per_item = [0] * n

    def item(self, item: d.ScoreItem, index: int) -> None:
        work = self._validator.item(item, index, self._seen)
        self._per_item[index] = work.judgments
        self._nli += work.nli

    def entries(self, n: int, name: str, where: str) -> None:
        self._validator.count(n, name, where)

    def done(self, items: Sequence[d.ScoreItem]) -> ValidatedBatch:
        if self._count != len(items) or len(self._seen) != len(items):
            raise RuntimeError("BatchCheck.done: not every item of the batch was checked")
        total = self._validator.total(sum(self._per_item), "items")
        return ValidatedBatch(tuple(items), total, tuple(self._per_item), self._nli)
