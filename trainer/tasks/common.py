"""The row every task produces: prompt (chat messages) + the ``extra_info`` its reward needs.

``extra_info`` always carries the same keys (parquet columns need one schema across rows);
unused ones are empty. The keys and their meaning: :mod:`reward_server.integrations.extra_info`
(the contract with the reward functions).
"""

from __future__ import annotations

from typing import Any

from reward_server.domain import RewardKind
from trainer.data.records import UserRecord

TASK_NAMES = ("rubric_generator", "personalized_generator")
DATA_SOURCE_PREFIX = "personal_reward"
PERSONALIZED_KINDS = (
    RewardKind.RUBRIC_SCORE.value, RewardKind.NLI_CONSTRAINTS.value, RewardKind.WEIGHTED.value,
)


def data_source(task_name: str, record: UserRecord) -> str:
    return f"{DATA_SOURCE_PREFIX}/{task_name}/{record.task.value}"


def base_extra_info(record: UserRecord, index: int) -> dict[str, Any]:
    return {
        "kind": "",
        "task": record.task.value,
        "user_id": record.user_id,
        "index": index,
        "history": [{"context": h.context, "text": h.text} for h in record.history],
        "target": {"context": record.target.context, "text": record.target.text},
        "baselines": [out for _, out in record.baselines],
        "baseline_methods": [m for m, _ in record.baselines],
        "variant": "",
        "rules": list(record.rules),
        "answer": record.answer,
        "preference": record.preference,
        "weights": {"rubric_score": 0.0, "nli_constraints": 0.0},
        "aggregate": "",
        "nli_reward_function": "",
    }
