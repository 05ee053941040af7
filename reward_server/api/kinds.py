"""THE facts of each reward kind, in one table every door and trainer reads.

A kind's facts are what is true of it on the wire, in a training row and in a trainer's log,
whoever scores it:

- its proto field: the ``reward.v1.ScoreItem`` ``oneof kind`` case (the value of its
  :class:`~reward_server.domain.RewardKind`);
- its response field: the field of its message that holds the policy's output, which a
  trainer fills in from the rollout (a combination has none: each of its parts has its own);
- a combination's repeated field of parts;
- its components (declared in :mod:`reward_server.components`), and from them the fixed ones a
  trainer logs for an item of any shape (:func:`component_names`, a weighted item's parts
  included);
- the repeated fields whose conversion costs per entry, each with the ``service.limits`` field
  that caps it (counted before any entry is converted).

The server half of a kind (its validation, its work, its score function) is
:mod:`reward_server.kinds`; each declaration there reads its facts from :data:`FACTS`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server.components import (
    Component,
    NliConstraints,
    ParlReward,
    RubricScore,
    Weighted,
    in_part,
)
from reward_server.domain import ComponentInfo, RewardKind


@dataclass(frozen=True)
class Counted:
    """A repeated field of a kind's message whose entries are counted before conversion."""

    field: str  # the repeated field
    limit: str  # the service.limits field capping its entries


@dataclass(frozen=True)
class KindFacts:
    """The facts of one reward kind (see the module doc)."""

    kind: RewardKind
    components: tuple[Component, ...]
    response_field: str | None  # None: a combination, each part has its own
    parts: str | None = None  # a combination's repeated field of parts
    counted: tuple[Counted, ...] = ()

    @property
    def proto_field(self) -> str:
        """The ``reward.v1.ScoreItem`` ``oneof kind`` field of this kind."""
        return self.kind.value

    @property
    def leaf(self) -> bool:
        """A leaf kind has a response field of its own; a combination has parts."""
        return self.response_field is not None

    @property
    def fixed_names(self) -> tuple[str, ...]:
        """Its own components that are not indexed families."""
        return tuple(c.name for c in self.components if not c.indexed)


FACTS: Mapping[RewardKind, KindFacts] = {
    RewardKind.RUBRIC_SCORE: KindFacts(RewardKind.RUBRIC_SCORE, RubricScore.ALL, "text"),
    RewardKind.PARL_REWARD: KindFacts(
        RewardKind.PARL_REWARD, ParlReward.ALL, "policy_output",
        counted=(Counted("history", "max_history_items"),),
    ),
    RewardKind.NLI_CONSTRAINTS: KindFacts(RewardKind.NLI_CONSTRAINTS, NliConstraints.ALL, "response"),
    RewardKind.WEIGHTED: KindFacts(
        RewardKind.WEIGHTED, Weighted.ALL, None, parts="parts",
        counted=(Counted("parts", "max_weighted_parts"),),
    ),
}
_BY_FIELD: Mapping[str, KindFacts] = {f.proto_field: f for f in FACTS.values()}
LEAF_KINDS = tuple(k for k, f in FACTS.items() if f.leaf)
LEAF_FIELDS = tuple(FACTS[k].proto_field for k in LEAF_KINDS)


def of_message(msg: pb.ScoreItem | pb.WeightedPart) -> KindFacts | None:
    """The facts of the kind ``msg``'s ``oneof kind`` sets; None when it sets none."""
    case = msg.WhichOneof("kind")
    return None if case is None else _BY_FIELD[case]


def parts_of(msg: pb.ScoreItem | pb.WeightedPart, facts: KindFacts) -> list[pb.WeightedPart]:
    """The parts of a combination ``msg`` of kind ``facts`` (none for a leaf)."""
    return [] if facts.parts is None else list(getattr(getattr(msg, facts.proto_field), facts.parts))


def leaves(item: pb.ScoreItem) -> list[tuple[pb.ScoreItem | pb.WeightedPart, KindFacts | None]]:
    """Each leaf of ``item`` (the item, or each part of a combination) with its kind's facts
    (None: the leaf sets no kind)."""
    facts = of_message(item)
    if facts is None or facts.leaf:
        return [(item, facts)]
    return [(part, of_message(part)) for part in parts_of(item, facts)]


def component_names(item: pb.ScoreItem | pb.WeightedPart) -> tuple[str, ...]:
    """The fixed components an item of this shape reports, read from the item itself: its
    kind's, and for a combination each part's own family members (``part{j}.reward``,
    ``part{j}.weight``) and the part's kind's components under ``part{j}.``. What every trainer
    logs for the item (verl's keys, TRL's means, OpenRLHF's ``extra_logs``), so that each
    weighted row logs its own parts' components (PARL's for a PARL part)."""
    facts = of_message(item)
    if facts is None:
        return ()
    out = list(facts.fixed_names)
    for j, part in enumerate(parts_of(item, facts)):
        out += [c.at(j) for c in facts.components if c.indexed]
        out += [in_part(j, name) for name in component_names(part)]
    return tuple(out)


def is_declared(kind: RewardKind, name: str) -> bool:
    """Whether ``name`` is a component ``kind`` may report (a combination's: its own, or any
    leaf kind's under ``part{j}.``)."""
    facts = FACTS[kind]
    if any(c.pattern().match(name) for c in facts.components):
        return True
    m = re.match(r"part\d+\.(.+)\Z", name)
    return (not facts.leaf and m is not None
            and any(is_declared(k, m.group(1)) for k in LEAF_KINDS))


def info() -> dict[str, tuple[ComponentInfo, ...]]:
    """The components as ``Info`` serves them: kind -> (name, meaning) pairs."""
    return {kind.value: tuple(ComponentInfo(c.name, c.meaning) for c in f.components)
            for kind, f in FACTS.items()}

