"""PARL settings: every constant of docs/parl.md is here, the released code's values as defaults.

Each deliberate difference from PARL's released code is a named switch whose default is the
released behaviour (docs/parl.md, "Released code, paper and ours").
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from reward_server.domain import RubricAggregate

TemplateVersion = Literal["parl-released", "parl-v1", "parl-v2"]
TEMPLATE_VERSIONS: tuple[TemplateVersion, ...] = ("parl-released", "parl-v1", "parl-v2")
Parser = Literal["released", "released-v1", "lenient"]


class RubricSettings(BaseModel):
    """Rubric scoring, PARL rewards and rubric induction (docs/parl.md §3-§4)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    template_version: TemplateVersion = Field(
        "parl-released", description="Prompt template family of the judge and the rubric "
        "generator (reward_server.rubric.templates): parl-released = the wording and block order "
        "of PARL's released prompt.py (default); parl-v1 (rule, then question) and parl-v2 "
        "(question, then rule) = this project's earlier wordings, kept to reproduce their runs."
    )
    parser: Parser | None = Field(
        None, description="Generator-output parsing: released = PARL's reward code (its "
        "postprocess applied twice, as compute_rubrics_score does: cut at the first </think> and "
        "its markers, twice; json.loads, no code fence; rules kept and measured as written; a "
        "rule that is a list or object is measured by len() and skipped outside the length "
        "bounds, judged as Python's str() of it inside them); released-v1 = this project's "
        "released parser before issue 52 (postprocess once; a rule that is not a string rejects "
        "the output); lenient = ours before parl-released (cut at the last </think>, one code "
        "fence tolerated, rules stripped, length after strip). None: the template's own "
        "(released for parl-released, lenient for parl-v1/v2)."
    )
    text_cleaning: Literal["released", "none"] = Field(
        "released", description="PARL's postprocess (cut after the first </think>, then after "
        "[Review]:, [Review Text]:, [Headline]:, [Content]:) on the texts the released scripts "
        "clean: the history texts InduceRubrics validates on (generate-rubrics) and every "
        "method's texts in `reward-server eval parl` (eval-test.py). none: texts as written "
        "(this project before issue 52)."
    )
    released_target_overwrite: bool = Field(
        False, description="Reproduce the released Amazon reward's bug: S(y_T) is judged on the "
        "history text its validation loop judged last (the last length-valid rule's first "
        "failing history item, or the last item), not on the target text (parl_rm_a.py reuses "
        "the name gt as its loop variable). Off: the target, as the paper's formula."
    )
    threshold: float = Field(
        0.5, ge=0.0, le=1.0, description="A rule is satisfied iff p_yes > threshold "
        "(>= with threshold_rule=ge)."
    )
    threshold_rule: Literal["gt", "ge"] = Field(
        "gt", description="gt: satisfied iff p_yes > threshold (the released code, the paper's "
        "algorithms); ge: p_yes >= threshold (the paper's text)."
    )
    induction_validation: Literal["released", "history_limit"] | None = Field(
        None, description="Which history items InduceRubrics validates on: released = the "
        "released scripts (Amazon: every item sent; News, Reddit: the last history_limit); "
        "history_limit = the last history_limit for every task. The generator always sees the "
        "last history_limit. None: the template's own (released for parl-released, "
        "history_limit for parl-v1/v2)."
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
    generation_max_new_tokens: int | None = Field(
        None, ge=1, description="Generator budget per sample. None: the rest of the generator's "
        "context, as the released scripts (no max_tokens sent: vLLM gives the rest of "
        "max_model_len). 1024 before issue 52."
    )
    generation_temperature: float = Field(
        0.6, ge=0.0, description="Generator sampling temperature (Qwen3's generation config, "
        "what the released scripts' server applies)."
    )
    generation_top_p: float = Field(
        0.95, gt=0.0, le=1.0, description="Generator nucleus top_p (Qwen3's generation config)."
    )
    generation_top_k: int | None = Field(
        20, ge=1, description="Generator top-k (Qwen3's generation config, applied by the "
        "released scripts' vLLM server; the released training preset's rollout.top_k). None: no "
        "top-k (before issue 52)."
    )
    generation_enable_thinking: bool | None = Field(
        None, description="The chat template's thinking switch for the generator's samples. "
        "None: no switch sent, the template's own default, as the released scripts (a Qwen3 "
        "generator thinks); false: this project before issue 52 (the judge's default "
        "engines.judge.enable_thinking). The judge's yes/no prompts keep engines.judge.enable_thinking."
    )

    @property
    def released_template(self) -> bool:
        return self.template_version == "parl-released"

    @property
    def parser_in_use(self) -> Parser:
        """``parser``, or the template's own when unset."""
        if self.parser is not None:
            return self.parser
        return "released" if self.released_template else "lenient"

    @property
    def induction_validation_in_use(self) -> Literal["released", "history_limit"]:
        """``induction_validation``, or the template's own when unset."""
        if self.induction_validation is not None:
            return self.induction_validation
        return "released" if self.released_template else "history_limit"

    def satisfied(self, p: float) -> bool:
        """Whether a rule with this p_yes holds (``threshold_rule``)."""
        return p >= self.threshold if self.threshold_rule == "ge" else p > self.threshold
