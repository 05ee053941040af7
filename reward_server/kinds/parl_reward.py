"""``parl_reward``: PARL-0/A/B reward of a rubric generator's output (parse, validate the rules
on the history, score the target and the baselines)."""

from __future__ import annotations

from reward_server import domain as d
from reward_server.errors import InvalidRequest
from reward_server.kinds.base import Checks, Kind, Science, Work
from reward_server.rubric import parl_reward


def validate(spec: d.ParlRewardSpec, checks: Checks, where: str) -> Work:
    """Judge prompts: an upper bound, ``rubric.max_rules`` rules on every judged history text,
    the target and each baseline."""
    checks.history(spec.history, f"{where}.history")
    checks.text(spec.target.context, f"{where}.target.context", required=False)
    checks.text(spec.target.text, f"{where}.target.text")
    if spec.variant is not d.ParlVariant.PARL_0 and not spec.baselines:
        raise InvalidRequest(
            f"{where}.baselines: PARL-{spec.variant.value} needs at least one baseline output"
        )
    checks.count(len(spec.baselines), "max_baselines", f"{where}.baselines")
    for k, b in enumerate(spec.baselines):
        checks.text(b, f"{where}.baselines[{k}]")
    rubric = checks.rubric
    texts = min(len(spec.history), rubric.history_limit) + 1 + len(spec.baselines)
    return Work(judge=rubric.max_rules * texts)


async def score(spec: d.ParlRewardSpec, science: Science) -> d.RewardOutcome:
    return await parl_reward(science.judge, spec, science.rubric)


KIND = Kind(
    kind=d.RewardKind.PARL_REWARD,
    spec=d.ParlRewardSpec,
    validate=validate,
    score=score,
)
