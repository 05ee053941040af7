"""``nli_constraints``: NLICV's reward of a response against an answer and a preference (two
NLI pairs)."""

from __future__ import annotations

from reward_server import domain as d
from reward_server.kinds.base import Checks, Kind, Science, Work
from reward_server.nli import nli_constraints_reward


def validate(spec: d.NliConstraintsSpec, checks: Checks, where: str) -> Work:
    checks.text(spec.answer, f"{where}.answer")
    checks.text(spec.preference, f"{where}.preference")
    return Work(nli=2)


async def score(spec: d.NliConstraintsSpec, science: Science) -> d.RewardOutcome:
    return await nli_constraints_reward(science.nli, spec, science.nlicv)


KIND = Kind(
    kind=d.RewardKind.NLI_CONSTRAINTS,
    spec=d.NliConstraintsSpec,
    validate=validate,
    score=score,
)
