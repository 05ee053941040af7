"""NLICV settings (docs/nlicv.md): templates, threshold, long-premise and evidence policies."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from reward_server.domain import NliRewardFunction, Regime

# Each template is rendered with exactly one named field (str.format); validated at load.
TEMPLATE_FIELDS: dict[str, str] = {
    "premise_template": "response",
    "correct_template": "answer",
    "aligned_template": "preference",
}


class NLISettings(BaseModel):
    """Constraint verification, regimes, rewards and evidence."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    template_version: Literal["nlicv-v1"] = Field(
        "nlicv-v1", description="Premise/hypothesis template family (the default templates "
        "below; Info also reports a digest of the templates actually configured)."
    )
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
    window_reserved_tokens: int = Field(
        4,
        ge=0,
        description="windows: tokens kept free for the model's special tokens ([CLS]/[SEP]) "
        "when packing premise sentences next to the hypothesis.",
    )
    evidence_mode: Literal["algorithm1", "cumulative"] = Field(
        "algorithm1",
        description="Critical premise units: remove one sentence from the full premise "
        "(Algorithm 1) or prune cumulatively (released code).",
    )
    sentence_split: Literal["released", "pysbd-v1"] = Field(
        "released", description="Sentence units of the evidence and of windows: released = "
        "the released code's re.split on '.', each piece stripped, empty pieces dropped, kept "
        "units joined by '. '; pysbd-v1 = pysbd's sentences joined by a space (before issue 52)."
    )
    pair_rule: Literal["ge", "gt"] = Field(
        "ge", description="An evidence pair (p, h) restores entailment when f(P without p, H "
        "without h) >= tau (ge, the released code's reading) or > tau (gt, the paper's "
        "Algorithm 2 and every other comparison here; before issue 52)."
    )
    no_critical: Literal["whole-text", "none"] = Field(
        "whole-text", description="When no unit of a side is critical: whole-text = the whole "
        "text is reported as critical (every unit), as the released code returns the text itself "
        "(so a one-sentence premise is critical even when the constraint fails); none = no "
        "critical unit (before issue 52)."
    )
    empty_text: Literal["released", "zero"] = Field(
        "released", description="An empty (or blank) response, answer or preference: released "
        "= rendered into its template and scored like any text (the released code scores "
        "'The answer is .'; only a blank rendered side scores 0); zero = 0 without an engine "
        "call (before issue 52)."
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
    weight_correct: float = Field(
        0.5, ge=0.0, description="w_c in weighted_sum: (w_c*S_c + w_a*S_a) / (w_c + w_a)."
    )
    weight_aligned: float = Field(0.5, ge=0.0, description="w_a in weighted_sum.")

    @model_validator(mode="after")
    def _check(self) -> NLISettings:
        for name, field_name in TEMPLATE_FIELDS.items():
            template = getattr(self, name)
            try:
                template.format(**{field_name: "x"})
            except (KeyError, IndexError, ValueError) as e:
                raise ValueError(
                    f"{name}={template!r} must use exactly the placeholder {{{field_name}}} "
                    f"(double other braces): {e!r}"
                ) from None
            if "{" + field_name + "}" not in template:
                raise ValueError(f"{name}={template!r} lacks the placeholder {{{field_name}}}")
        wanted = {r.value for r in Regime}
        if set(self.regime_rewards) != wanted:
            raise ValueError(
                f"regime_rewards must name exactly {sorted(wanted)}, "
                f"got {sorted(self.regime_rewards)}"
            )
        if self.weight_correct + self.weight_aligned <= 0.0:
            raise ValueError("weight_correct + weight_aligned must be > 0 for weighted_sum")
        return self
