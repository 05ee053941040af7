"""PARL settings: every constant of docs/parl.md is here, the paper's values as defaults."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from reward_server.domain import RubricAggregate


class RubricSettings(BaseModel):
    """Rubric scoring, PARL rewards and rubric induction (docs/parl.md §3-§4)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    template_version: Literal["parl-v2"] = Field(
        "parl-v2", description="Prompt template family version (the judge and generator "
        "prompts of reward_server.rubric.templates)."
    )
    threshold: float = Field(
        0.5, ge=0.0, le=1.0, description="A rule is satisfied iff p_yes > threshold."
    )
    history_limit: int = Field(10, ge=1, description="Only the last N history items are used.")
    reward_lambda: float = Field(10.0, gt=0.0, description="lambda in R = 0.1 + lambda*C*...")
    margin_k: float = Field(20.0, gt=0.0, description="k in Gamma = prod_b sigmoid(k * Delta_b).")
    format_floor: float = Field(
        0.1, description="PARL base reward, and the reward when survivors fall outside the bounds."
    )
    min_rules: int = Field(2, ge=1, description="Fewest rules (parsed, and surviving) allowed.")
    max_rules: int = Field(10, ge=1, description="Most rules (parsed, and surviving) allowed.")
    min_rule_chars: int = Field(20, ge=0, description="Training: shorter rules are skipped.")
    max_rule_chars: int = Field(400, ge=1, description="Training: longer rules are skipped.")
    cardinality: Literal["threshold", "linear"] = Field(
        "threshold", description="C = min(1, |R|/2) (threshold) or |R|/10 (linear, App. G.2)."
    )
    validation_early_exit: bool = Field(
        False,
        description="Judge history items in rounds and stop judging a rule once it fails one "
        "(fewer judge calls, more round trips). Off: one batched pass.",
    )
    default_aggregate: RubricAggregate = Field(
        RubricAggregate.MEAN_P_YES, description="rubric_score aggregate when the item names none."
    )
    induction_samples: int = Field(5, ge=1, description="k generator samples for InduceRubrics.")
    generation_max_new_tokens: int = Field(1024, ge=1, description="Generator budget per sample.")
    generation_temperature: float = Field(
        0.6, ge=0.0, description="Generator sampling temperature."
    )
    generation_top_p: float = Field(0.95, gt=0.0, le=1.0, description="Generator nucleus top_p.")
