"""One training row per user record, for either task (the tasks' common entry point).

Its ``extra_info`` is written by the row contract's one writer,
:func:`reward_server.api.rows.extra_info`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reward_server.api.rows import extra_info
from reward_server.domain import ItemSpec, ParlVariant, RewardKind, RubricAggregate
from trainer.data.records import UserRecord
from trainer.tasks import personalized_generator, rubric_generator
from trainer.tasks.common import TASK_NAMES, data_source


def build_row(
    task_name: str,
    record: UserRecord,
    index: int,
    *,
    variant: ParlVariant = ParlVariant.PARL_A,
    reward_kind: RewardKind = RewardKind.RUBRIC_SCORE,
    weights: Mapping[str, float] | None = None,
    aggregate: RubricAggregate | None = None,
    history_limit: int = 10,
) -> dict[str, Any]:
    """One verl row: ``data_source, prompt, ability, reward_model, extra_info``."""
    spec: ItemSpec
    if task_name == "rubric_generator":
        prompt = rubric_generator.build_prompt(record, history_limit=history_limit)
        spec = rubric_generator.build_spec(record, variant=variant)
    elif task_name == "personalized_generator":
        prompt = personalized_generator.build_prompt(record, history_limit=history_limit)
        spec = personalized_generator.build_spec(
            record, reward_kind=reward_kind, weights=weights, aggregate=aggregate
        )
    else:
        raise ValueError(f"unknown task {task_name!r}; choose one of {TASK_NAMES}")
    return {
        "data_source": data_source(task_name, record),
        "prompt": prompt,
        "ability": "personalization",
        "reward_model": {"style": "model", "ground_truth": record.target.text},
        "extra_info": extra_info(spec, user_id=record.user_id, index=index),
    }
