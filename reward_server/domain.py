"""Domain types shared by every layer: frozen dataclasses, no protobuf, no torch.

The transport layer (``rpc/``) converts protobuf messages into these types and back; the
orchestration layer (``service``) and the science modules (``rubric/``, ``nli/``) only ever see
these.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field


class Task(str, enum.Enum):
    """Which prompt family a rubric item belongs to (docs/parl.md §6)."""

    GENERIC = "generic"
    AMAZON = "amazon"
    NEWS = "news"
    REDDIT = "reddit"


class ParlVariant(str, enum.Enum):
    """PARL reward variant (docs/parl.md §4)."""

    PARL_0 = "0"
    PARL_A = "A"
    PARL_B = "B"


class RubricAggregate(str, enum.Enum):
    """How a personalized generator's text is scored under its user's rubric."""

    MEAN_P_YES = "mean_p_yes"
    FRACTION_SATISFIED = "fraction_satisfied"
    ALL_SATISFIED = "all_satisfied"


class NliRewardFunction(str, enum.Enum):
    """How the ``nli_constraints`` reward is computed from S_correct and S_aligned."""

    REGIME = "regime"
    ALIGNED_ONLY = "aligned_only"
    PRODUCT = "product"
    WEIGHTED_SUM = "weighted_sum"


class Regime(str, enum.Enum):
    """NLICV confusion-matrix regime (docs/nlicv.md §2)."""

    PERSONALIZATION = "personalization"
    GENERALIZATION = "generalization"
    SYCOPHANCY = "sycophancy"
    FAILURE = "failure"


class RewardKind(str, enum.Enum):
    """The reward kinds of a ScoreItem, spelled as the proto's ``oneof kind`` fields (the same
    spelling in metrics labels, trainer ``extra_info`` and :mod:`reward_server.components`)."""

    RUBRIC_SCORE = "rubric_score"
    PARL_REWARD = "parl_reward"
    NLI_CONSTRAINTS = "nli_constraints"
    WEIGHTED = "weighted"


class ItemStatus(str, enum.Enum):
    """Outcome of one scored item. Infrastructure failures are never an item status."""

    OK = "ok"
    POLICY_INVALID = "policy_invalid"


@dataclass(frozen=True)
class HistoryItem:
    """One (context, text) pair: x_i and the user's own y_i."""

    context: str
    text: str


@dataclass(frozen=True)
class RubricScoreSpec:
    """Score a personalized generator's ``text`` under a user's ``rules``."""

    context: str
    text: str
    rules: tuple[str, ...]
    task: Task = Task.GENERIC
    aggregate: RubricAggregate | None = None  # None: server default


@dataclass(frozen=True)
class ParlRewardSpec:
    """PARL reward for a rubric generator's raw output (the policy's rollout)."""

    history: tuple[HistoryItem, ...]
    policy_output: str
    target: HistoryItem
    baselines: tuple[str, ...]
    variant: ParlVariant
    task: Task = Task.GENERIC


@dataclass(frozen=True)
class NliConstraintsSpec:
    """NLICV constraint reward for a response against an answer and a preference."""

    response: str
    answer: str
    preference: str
    reward_function: NliRewardFunction | None = None  # None: server default


LeafSpec = RubricScoreSpec | ParlRewardSpec | NliConstraintsSpec


@dataclass(frozen=True)
class WeightedPart:
    weight: float
    spec: LeafSpec


@dataclass(frozen=True)
class WeightedSpec:
    """Weighted combination: reward = sum(w_i * r_i) / sum(w_i)."""

    parts: tuple[WeightedPart, ...]


ItemSpec = RubricScoreSpec | ParlRewardSpec | NliConstraintsSpec | WeightedSpec


_KIND_OF: dict[type, RewardKind] = {
    RubricScoreSpec: RewardKind.RUBRIC_SCORE,
    ParlRewardSpec: RewardKind.PARL_REWARD,
    NliConstraintsSpec: RewardKind.NLI_CONSTRAINTS,
    WeightedSpec: RewardKind.WEIGHTED,
}


def kind_of(spec: ItemSpec) -> RewardKind:
    """The reward kind of an item spec."""
    return _KIND_OF[type(spec)]


@dataclass(frozen=True)
class ScoreItem:
    item_id: str
    spec: ItemSpec


@dataclass(frozen=True)
class RewardOutcome:
    """What a science module returns for one leaf item.

    ``policy_invalid`` is set (with a human-readable reason) when the policy's output was
    malformed; the science then leaves ``reward`` None and the service gives the item the
    configured penalty (``service.policy_invalid_penalty``). A failed judge or verifier is an
    exception, never an outcome.
    """

    reward: float | None
    components: Mapping[str, float] = field(default_factory=dict)
    policy_invalid: str | None = None


@dataclass(frozen=True)
class ItemResult:
    item_id: str
    status: ItemStatus
    reward: float | None
    components: Mapping[str, float] = field(default_factory=dict)
    timings_ms: Mapping[str, float] = field(default_factory=dict)
    message: str = ""


@dataclass(frozen=True)
class InductionAttempt:
    """One sampled generator output during rubric induction."""

    raw_output: str
    parsed_rules: tuple[str, ...]
    valid_rules: tuple[str, ...]
    invalid_reason: str | None = None


@dataclass(frozen=True)
class InductionResult:
    rules: tuple[str, ...]
    covered: bool
    attempts: tuple[InductionAttempt, ...]
    best_attempt: int  # index into attempts; -1 when no attempt produced a valid rule


@dataclass(frozen=True)
class EvidencePair:
    premise_index: int
    hypothesis_index: int


@dataclass(frozen=True)
class ConstraintEvidence:
    """Sentence-level evidence for one constraint (docs/nlicv.md §4)."""

    constraint: str  # "correct" | "aligned"
    score: float
    premise_units: tuple[str, ...]
    hypothesis_units: tuple[str, ...]
    critical_premise: tuple[int, ...]
    critical_hypothesis: tuple[int, ...]
    pairs: tuple[EvidencePair, ...]


@dataclass(frozen=True)
class Verification:
    s_correct: float
    s_aligned: float
    regime: Regime
    truncated: bool
    evidence: tuple[ConstraintEvidence, ...] = ()


@dataclass(frozen=True)
class ComponentInfo:
    """One reward component: its name in ``ItemResult.components`` and what it measures."""

    name: str
    meaning: str


@dataclass(frozen=True)
class ServerInfo:
    api_version: str
    server_version: str
    judge_model: str
    nli_model: str
    template_versions: Mapping[str, str]
    settings: Mapping[str, str]
    components: Mapping[str, tuple[ComponentInfo, ...]] = field(default_factory=dict)
    fake_engines: bool = False
