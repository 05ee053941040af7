"""PARL science: rubric parsing, consistency validation, judge scoring, rewards, induction.

Pure async functions over a :class:`reward_server.backends.base.JudgeEngine`; no Ray, gRPC or
weights. See docs/parl.md for the formulas.
"""

from reward_server.rubric.induction import induce_rubrics
from reward_server.rubric.parsing import ParsedRubric, parse_rubric_output
from reward_server.rubric.scoring import parl_reward, score_rubric, validate_rule_sets
from reward_server.rubric.settings import RubricSettings
from reward_server.rubric.templates import template_versions

__all__ = [
    "ParsedRubric",
    "RubricSettings",
    "induce_rubrics",
    "parl_reward",
    "parse_rubric_output",
    "score_rubric",
    "template_versions",
    "validate_rule_sets",
]
