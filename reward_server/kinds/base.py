"""What one reward kind declares, and the two faces it sees of the service.

A kind is a :class:`Kind`: its :class:`~reward_server.domain.RewardKind`, whose facts (the
``oneof kind`` field of ``reward.v1.ScoreItem``, the field that carries the policy's response,
the components) are its entry in the one table :data:`reward_server.api.kinds.FACTS`; the
domain spec it scores, how a request of it is validated and what it costs (:class:`Work`: judge
prompts and NLI pairs), and its score function. The service dispatches every item through
:func:`reward_server.kinds.of`; it never names a kind itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, cast

from reward_server import domain as d
from reward_server.api.kinds import FACTS, KindFacts
from reward_server.backends.base import JudgeEngine, NLIEngine
from reward_server.components import Component
from reward_server.nli.settings import NLISettings
from reward_server.rubric.settings import RubricSettings

S = TypeVar("S")


@dataclass(frozen=True)
class Work:
    """What a spec costs the engines: judge prompts and NLI pairs. Their sum, ``judgments``,
    is the unit request limits and admission count; admission also follows the mix (its floor
    is one full batch of each engine the calls use)."""

    judge: int = 0
    nli: int = 0

    @property
    def judgments(self) -> int:
        return self.judge + self.nli

    def __add__(self, other: Work) -> Work:
        return Work(self.judge + other.judge, self.nli + other.nli)


class Checks(Protocol):
    """The request limits a kind's validation checks against
    (:class:`reward_server.service.validation.Validator`)."""

    rubric: RubricSettings
    nlicv: NLISettings

    def text(self, value: str, where: str, *, required: bool = True) -> None:
        """Refuse a text over ``service.limits.max_text_bytes`` (or empty, if ``required``)."""

    def count(self, n: int, name: str, where: str) -> None:
        """Refuse ``n`` entries at ``where`` if over the limit called ``name``."""

    def history(self, items: Sequence[d.HistoryItem], where: str) -> None:
        """Refuse an empty or too long history, or one with a bad text."""

    def spec(self, spec: d.ItemSpec, where: str) -> Work:
        """Validate a (part's) spec of any kind; its work."""


class Science(Protocol):
    """What a kind's score function runs on (:class:`reward_server.service.RewardService`)."""

    judge: JudgeEngine
    nli: NLIEngine
    rubric: RubricSettings
    nlicv: NLISettings

    async def leaf(self, spec: d.LeafSpec) -> d.RewardOutcome:
        """The outcome of one leaf spec, its policy output checked and penalised as for an item."""


@dataclass(frozen=True)
class Kind(Generic[S]):
    """The declaration of one reward kind (see the module doc)."""

    kind: d.RewardKind
    spec: type[S]
    validate: Callable[[S, Checks, str], Work]  # (spec, checks, where) -> its work; InvalidRequest
    score: Callable[[S, Science], Awaitable[d.RewardOutcome]]

    @property
    def facts(self) -> KindFacts:
        """Its entry in the one table of kind facts."""
        return FACTS[self.kind]

    @property
    def proto_field(self) -> str:
        """The ``reward.v1.ScoreItem`` ``oneof kind`` field of this kind."""
        return self.facts.proto_field

    @property
    def components(self) -> tuple[Component, ...]:
        return self.facts.components

    @property
    def response_field(self) -> str | None:
        """The spec field with the policy's output (the proto's, same name); None: a
        combination, each part has its own."""
        return self.facts.response_field

    async def outcome(self, spec: S, science: Science) -> d.RewardOutcome:
        """The outcome of ``spec`` sent as an item: a leaf kind's through ``science.leaf`` (the
        policy output checked, the penalty applied), a combination's its own score (whose
        parts go through ``science.leaf``)."""
        if self.facts.leaf:
            return await science.leaf(cast(d.LeafSpec, spec))
        return await self.score(spec, science)

    def response(self, spec: S) -> str:
        """The policy's output in ``spec`` (a leaf kind's ``response_field``)."""
        if self.response_field is None:
            raise TypeError(f"{self.kind.value} has no response field of its own")
        value = getattr(spec, self.response_field)
        if not isinstance(value, str):  # pragma: no cover - a declaration error
            raise TypeError(f"{self.kind.value}.{self.response_field} is not a text field")
        return value
