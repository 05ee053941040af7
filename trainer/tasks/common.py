"""What every task shares: the task names, the data_source tag and the personalized kinds.

A row's reward inputs are one ScoreItem template written through
:func:`reward_server.api.rows.extra_info` (the row contract every trainer reads);
each task builds the item's spec with its response left empty.
"""

from __future__ import annotations

from reward_server.domain import RewardKind
from trainer.data.records import UserRecord

TASK_NAMES = ("rubric_generator", "personalized_generator")
DATA_SOURCE_PREFIX = "personal_reward"
PERSONALIZED_KINDS = (RewardKind.RUBRIC_SCORE, RewardKind.NLI_CONSTRAINTS, RewardKind.WEIGHTED)


def data_source(task_name: str, record: UserRecord) -> str:
    return f"{DATA_SOURCE_PREFIX}/{task_name}/{record.task.value}"
