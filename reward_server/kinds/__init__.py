"""The reward kinds' server half: one module each, declaring its domain spec, validation and
judgments and score function (:class:`~reward_server.kinds.base.Kind`); its facts (proto field,
response field, components) are its entry in :data:`reward_server.api.kinds.FACTS`, the one
table the doors and the trainers read too.

:data:`KINDS` lists them by :class:`~reward_server.domain.RewardKind`; :func:`of` is the one
dispatch from a spec to its kind. A new kind is its module here (registered in :data:`KINDS`),
its spec in :mod:`reward_server.domain`, its components in :mod:`reward_server.components`,
its facts in :mod:`reward_server.api.kinds` and its proto message (converted in
:mod:`reward_server.api.convert`, whose ``match`` statements mypy checks are exhaustive).

Layer: orchestration, under the service (it knows the science and the engines' protocols,
never the transport; the ``reward.v1`` messages are converted in :mod:`reward_server.api.convert`,
keyed by the same :class:`~reward_server.domain.RewardKind`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reward_server import domain as d
from reward_server.kinds import nli_constraints, parl_reward, rubric_score, weighted
from reward_server.kinds.base import Checks, Kind, Science, Work

__all__ = ["KINDS", "Checks", "Kind", "Science", "Work", "of"]

KINDS: Mapping[d.RewardKind, Kind[Any]] = {
    k.kind: k
    for k in (rubric_score.KIND, parl_reward.KIND, nli_constraints.KIND, weighted.KIND)
}
_BY_SPEC: Mapping[type, Kind[Any]] = {k.spec: k for k in KINDS.values()}


def of(spec: d.ItemSpec) -> Kind[Any]:
    """The kind of ``spec`` (every member of :data:`reward_server.domain.ItemSpec` has one;
    tests/unit/kinds holds the registry to it)."""
    return _BY_SPEC[type(spec)]
