"""Rubric generator task: the policy reads a user's history and writes their rubric (PARL).

The prompt is the reward server's own rubric-generator prompt
(:func:`reward_server.rubric.templates.generator_request`), so training and inference-time
induction ask the same question. The reward is a PARL-0/A/B item: the user's history (rule
validation), the target and the baselines travel in its template (``extra_info``).
"""

from __future__ import annotations

from reward_server.config import RubricSettings
from reward_server.domain import ParlRewardSpec, ParlVariant
from reward_server.prompts import generator_request
from trainer.data.records import DataFormatError, UserRecord


def build_prompt(
    record: UserRecord, *, history_limit: int = 10, settings: RubricSettings | None = None
) -> list[dict[str, str]]:
    """System + user chat messages of the rubric generator over the last ``history_limit`` items."""
    settings = settings or RubricSettings.model_validate({})
    request = generator_request(record.history[-history_limit:], record.task, settings, seed=None)
    return [
        {"role": "system", "content": request.system},
        {"role": "user", "content": request.user},
    ]


def build_spec(record: UserRecord, *, variant: ParlVariant = ParlVariant.PARL_A) -> ParlRewardSpec:
    """The row's PARL item, its policy output left empty (the rollout fills it in)."""
    if variant is not ParlVariant.PARL_0 and not record.baselines:
        raise DataFormatError(
            record.source or "<records>", None, "baselines",
            f"user {record.user_id!r} has no baseline outputs; PARL-{variant.value} needs them "
            "(pass --baselines FILE, or use --variant 0)",
        )
    return ParlRewardSpec(history=record.history, policy_output="", target=record.target,
                          baselines=tuple(out for _, out in record.baselines), variant=variant,
                          task=record.task)
