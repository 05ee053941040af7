"""The reward kinds: one module each, declaring its proto field, validation and judgments,
score function, components and response field (:class:`~reward_server.kinds.base.Kind`).

:func:`of` is the one dispatch from a spec to its kind (a ``match`` that mypy checks is
exhaustive: a spec type added to :data:`reward_server.domain.ItemSpec` without a case here
fails type checking); :data:`KINDS` lists them by :class:`~reward_server.domain.RewardKind`.

Layer: orchestration, under the service (it knows the science and the engines' protocols,
never the transport; the ``reward.v1`` messages are converted in :mod:`reward_server.rpc.convert`,
keyed by the same :class:`~reward_server.domain.RewardKind`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, assert_never

from reward_server import domain as d
from reward_server.kinds import nli_constraints, parl_reward, rubric_score, weighted
from reward_server.kinds.base import Checks, Kind, Science

__all__ = ["KINDS", "Checks", "Kind", "Science", "of"]

KINDS: Mapping[d.RewardKind, Kind[Any]] = {
    k.kind: k
    for k in (rubric_score.KIND, parl_reward.KIND, nli_constraints.KIND, weighted.KIND)
}


def of(spec: d.ItemSpec) -> Kind[Any]:
    """The kind of ``spec``."""
    match spec:
        case d.RubricScoreSpec():
            return rubric_score.KIND
        case d.ParlRewardSpec():
            return parl_reward.KIND
        case d.NliConstraintsSpec():
            return nli_constraints.KIND
        case d.WeightedSpec():
            return weighted.KIND
        case _:
            assert_never(spec)
