"""A whole Score call converted item by item: the items of an encoded ScoreRequest
(:func:`score_items`, each checked as soon as it is converted) and the ScoreResponse of its
results (:func:`score_response`), with :func:`reward_server.cooperative.turn` between items, so
that the largest call allowed never holds the event loop for long.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from reward_server import cooperative
from reward_server import domain as d
from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server.api import kinds, wire
from reward_server.api.convert import item_from_proto, result_to_proto
from reward_server.errors import InvalidRequest


class BatchCheck(Protocol):
    """Validation of a Score batch as it is converted
    (:class:`reward_server.service.validation.BatchCheck`)."""

    max_items: int
    max_item_bytes: int

    def size(self, n: int) -> None:
        """Refuse a batch of ``n`` items (``max_items + 1``: more than allowed)."""

    def item(self, item: d.ScoreItem, index: int) -> None:
        """Refuse item ``index``, converted."""

    def entries(self, n: int, name: str, where: str) -> None:
        """Refuse ``n`` entries of a repeated field at ``where`` over the limit ``name``
        (a field of ``service.limits``), before they are converted."""


def _precount(msg: pb.ScoreItem | pb.WeightedPart, where: str, check: BatchCheck) -> None:
    """The repeated fields whose conversion costs per entry (each kind's ``counted`` facts, a
    combination's parts' too), counted before any is converted (one item of 200,000 history
    entries held the event loop 0.7 s before validation saw it). A message that sets no kind is
    left to :func:`~reward_server.api.convert.item_from_proto`, which says so."""
    facts = kinds.of_message(msg)
    if facts is None:
        return
    body = getattr(msg, facts.proto_field)
    for counted in facts.counted:
        check.entries(len(getattr(body, counted.field)), counted.limit,
                      f"{where}.{facts.proto_field}.{counted.field}")
    for j, part in enumerate(kinds.parts_of(msg, facts)):
        _precount(part, f"{where}.{facts.proto_field}.{facts.parts}[{j}]", check)


async def score_items(raw: bytes, check: BatchCheck) -> list[d.ScoreItem]:
    """The items of an encoded ScoreRequest, parsed and converted one at a time.
    ``check.size(n)`` sees the number of items before any is parsed (and ``n = max_items + 1``
    as soon as the split meets one item more than ``max_items``: it must refuse it),
    ``check.item(item, i)`` each item as soon as it is converted (either may refuse, before
    the rest is parsed)."""
    max_item_bytes = check.max_item_bytes
    elements, rest = wire.split_repeated(  # stops at the first item past the cap
        raw, 1, "reward.v1.ScoreRequest", max_elements=check.max_items, too_many=check.size
    )
    if rest:
        wire.parse(pb.ScoreRequest, rest)  # other (unknown) fields must still be well-formed
    check.size(len(elements))
    items: list[d.ScoreItem] = []
    # Items of one request mostly share their rules (one user's rubric over many texts); the
    # wire gives each item new string objects: keep one of each (a 1,024-item x 64-rule request
    # held 65,536 rule strings, ~7 MiB of its peak, measured with tracemalloc)
    strings: dict[str, str] = {}
    for i, element in enumerate(elements):
        await cooperative.turn(urgent=True)  # admission decides only after this: keep it quick
        if len(element) > max_item_bytes:
            raise InvalidRequest(
                f"items[{i}]: {len(element)} bytes exceed service.limits.max_item_bytes="
                f"{max_item_bytes}; send smaller items"
            )
        msg = wire.parse(pb.ScoreItem, element, f"reward.v1.ScoreItem at items[{i}]")
        _precount(msg, f"items[{i}]", check)
        item = item_from_proto(msg, i, strings)
        check.item(item, i)
        items.append(item)
    return items


async def score_response(results: Sequence[d.ItemResult]) -> pb.ScoreResponse:
    """The ScoreResponse of ``results``, built one result at a time."""
    response = pb.ScoreResponse()
    for r in results:
        await cooperative.turn(urgent=True)  # finishing a call frees its capacity
        response.results.append(result_to_proto(r))
    return response
