"""``weighted``: a weighted mean of leaf kinds' rewards, each part scored (and penalised) as
an item of its own kind would be."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence

from reward_server import domain as d
from reward_server.components import Weighted, in_part
from reward_server.errors import InvalidRequest
from reward_server.kinds.base import Checks, Kind, Science, Work


def weighted_mean(weights: Sequence[float], values: Sequence[float]) -> float:
    """sum(w*v)/sum(w) as a convex combination: finite for any finite values and finite,
    non-negative weights with a positive one (no overflow of the sums, no 0/0)."""
    top = max(weights)
    scaled = [w / top for w in weights]  # in [0, 1], the largest is 1
    total = math.fsum(scaled)  # in [1, len(weights)]
    return math.fsum((w / total) * v for w, v in zip(scaled, values, strict=True))


def validate(spec: d.WeightedSpec, checks: Checks, where: str) -> Work:
    """Work: the sum of the parts'."""
    w = f"{where}.parts"
    if not spec.parts:
        raise InvalidRequest(f"{w}: needs at least one part")
    checks.count(len(spec.parts), "max_weighted_parts", w)
    work = Work()
    for j, part in enumerate(spec.parts):
        if not math.isfinite(part.weight) or part.weight < 0:
            raise InvalidRequest(
                f"{w}[{j}].weight: {part.weight} is not a finite non-negative number"
            )
        if isinstance(part.spec, d.WeightedSpec):  # pragma: no cover - proto forbids it
            raise InvalidRequest(f"{w}[{j}]: combinations do not nest")
        work += checks.spec(part.spec, f"{w}[{j}]")
    if not max(p.weight for p in spec.parts) > 0:
        raise InvalidRequest(f"{w}: weights sum to 0; at least one weight must be positive")
    return work


async def score(spec: d.WeightedSpec, science: Science) -> d.RewardOutcome:
    outcomes = await asyncio.gather(*(science.leaf(p.spec) for p in spec.parts))
    rewards = [float(o.reward) if o.reward is not None else math.nan for o in outcomes]
    reward = weighted_mean([p.weight for p in spec.parts], rewards)
    components: dict[str, float] = {}
    invalid: list[str] = []
    for j, (part, o) in enumerate(zip(spec.parts, outcomes, strict=True)):
        components[Weighted.PART_REWARD.at(j)] = rewards[j]
        components[Weighted.PART_WEIGHT.at(j)] = part.weight
        components.update({in_part(j, k): v for k, v in o.components.items()})
        if o.policy_invalid:
            invalid.append(f"part{j}: {o.policy_invalid}")
    return d.RewardOutcome(
        reward=reward, components=components, policy_invalid="; ".join(invalid) or None
    )


KIND = Kind(
    kind=d.RewardKind.WEIGHTED,
    spec=d.WeightedSpec,
    validate=validate,
    score=score,
)
