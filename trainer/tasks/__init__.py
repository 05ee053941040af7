"""Training tasks: how a user record becomes a prompt, and what the reward needs (extra_info).

``rubric_generator``: the policy writes a rubric from the user's history; PARL-0/A/B reward.
``personalized_generator``: the policy writes the user's text for a new context; rubric score
under the user's induced rules, NLICV constraints, or a weighted mix.
:mod:`reward_server.api.rows` writes each row's ``extra_info`` (a ScoreItem
template, the user, the index) and turns it plus a rollout back into a reward-server item (the
contract between ``trainer.data.prepare`` and every trainer's reward function).
"""

from trainer.tasks.common import TASK_NAMES
from trainer.tasks.rows import build_row

__all__ = ["TASK_NAMES", "build_row"]
