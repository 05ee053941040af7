"""``rubric_score``: a personalized generator's text under its user's rules (one judge prompt
per rule)."""

from __future__ import annotations

from reward_server import domain as d
from reward_server.errors import InvalidRequest
from reward_server.kinds.base import Checks, Kind, Science, Work
from reward_server.rubric import score_rubric


def validate(spec: d.RubricScoreSpec, checks: Checks, where: str) -> Work:
    checks.text(spec.context, f"{where}.context", required=False)
    if not spec.rules:
        raise InvalidRequest(f"{where}.rules: needs at least one rule")
    checks.count(len(spec.rules), "max_rules_per_item", f"{where}.rules")
    for k, rule in enumerate(spec.rules):
        checks.text(rule, f"{where}.rules[{k}]")
    return Work(judge=len(spec.rules))


async def score(spec: d.RubricScoreSpec, science: Science) -> d.RewardOutcome:
    return await score_rubric(science.judge, spec, science.rubric)


KIND = Kind(
    kind=d.RewardKind.RUBRIC_SCORE,
    spec=d.RubricScoreSpec,
    validate=validate,
    score=score,
)
