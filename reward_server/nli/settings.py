"""NLICV settings (METHODS §2): templates, threshold, long-premise and evidence policies."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from reward_server.domain import NliRewardFunction


class NLISettings(BaseModel):
    """Constraint verification, regimes, rewards and evidence."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    template_version: str = Field("nlicv-v1", description="Premise/hypothesis template version.")
    threshold: float = Field(0.5, ge=0.0, le=1.0, description="tau_sem: satisfied iff S > tau.")
    premise_template: str = Field("The answer is {response}.", description="Premise for both.")
    correct_template: str = Field(
        "The content of the answer is about {answer}.", description="Hypothesis of Correct(r, a)."
    )
    aligned_template: str = Field(
        "The content of the answer is about {preference}.",
        description="Hypothesis of Aligned(r, i).",
    )
    long_premise: Literal["truncate", "windows"] = Field(
        "truncate",
        description="Premises over the model's max length: cut (reported) or split into sentence "
        "windows that fit, scored separately, max over windows.",
    )
    evidence_mode: Literal["algorithm1", "cumulative"] = Field(
        "algorithm1",
        description="Critical premise units: remove one sentence from the full premise "
        "(Algorithm 1) or prune cumulatively (released code).",
    )
    default_reward_function: NliRewardFunction = Field(
        NliRewardFunction.REGIME, description="nli_constraints reward when the item names none."
    )
    regime_rewards: dict[str, float] = Field(
        default_factory=lambda: {
            "personalization": 1.0,
            "generalization": 0.5,
            "sycophancy": 0.0,
            "failure": 0.0,
        },
        description="Reward per regime for the 'regime' reward function.",
    )
    weight_correct: float = Field(0.5, ge=0.0, description="w_c in weighted_sum: w_c*S_c + w_a*S_a.")
    weight_aligned: float = Field(0.5, ge=0.0, description="w_a in weighted_sum.")
