"""Rubric generator task: the policy reads a user's history and writes their rubric (PARL).

The prompt is the reward server's own rubric-generator prompt
(:func:`reward_server.rubric.templates.generator_request`), so training and inference-time
induction ask the same question. The reward is a PARL-0/A/B item: the user's history (rule
validation), the target and the baselines travel in ``extra_info``.
"""

from __future__ import annotations

from typing import Any

from reward_server.config import RubricSettings
from reward_server.domain import ParlVariant, RewardKind
from reward_server.rubric.templates import generator_request
from trainer.data.records import DataFormatError, UserRecord
from trainer.tasks.common import base_extra_info


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


def build_extra_info(
    record: UserRecord, index: int, *, variant: ParlVariant = ParlVariant.PARL_A
) -> dict[str, Any]:
    if variant is not ParlVariant.PARL_0 and not record.baselines:
        raise DataFormatError(
            record.source or "<records>", None, "baselines",
            f"user {record.user_id!r} has no baseline outputs; PARL-{variant.value} needs them "
            "(pass --baselines FILE, or use --variant 0)",
        )
    extra = base_extra_info(record, index)
    extra["kind"] = RewardKind.PARL_REWARD.value
    extra["variant"] = variant.value
    return extra
