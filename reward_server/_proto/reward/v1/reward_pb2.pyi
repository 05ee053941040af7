from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Task(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_UNSPECIFIED: _ClassVar[Task]
    TASK_GENERIC: _ClassVar[Task]
    TASK_AMAZON: _ClassVar[Task]
    TASK_NEWS: _ClassVar[Task]
    TASK_REDDIT: _ClassVar[Task]

class ParlVariant(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PARL_VARIANT_UNSPECIFIED: _ClassVar[ParlVariant]
    PARL_VARIANT_0: _ClassVar[ParlVariant]
    PARL_VARIANT_A: _ClassVar[ParlVariant]
    PARL_VARIANT_B: _ClassVar[ParlVariant]

class RubricAggregate(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUBRIC_AGGREGATE_UNSPECIFIED: _ClassVar[RubricAggregate]
    RUBRIC_AGGREGATE_MEAN_P_YES: _ClassVar[RubricAggregate]
    RUBRIC_AGGREGATE_FRACTION_SATISFIED: _ClassVar[RubricAggregate]
    RUBRIC_AGGREGATE_ALL_SATISFIED: _ClassVar[RubricAggregate]

class NliRewardFunction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NLI_REWARD_FUNCTION_UNSPECIFIED: _ClassVar[NliRewardFunction]
    NLI_REWARD_FUNCTION_REGIME: _ClassVar[NliRewardFunction]
    NLI_REWARD_FUNCTION_ALIGNED_ONLY: _ClassVar[NliRewardFunction]
    NLI_REWARD_FUNCTION_PRODUCT: _ClassVar[NliRewardFunction]
    NLI_REWARD_FUNCTION_WEIGHTED_SUM: _ClassVar[NliRewardFunction]

class Regime(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REGIME_UNSPECIFIED: _ClassVar[Regime]
    REGIME_PERSONALIZATION: _ClassVar[Regime]
    REGIME_GENERALIZATION: _ClassVar[Regime]
    REGIME_SYCOPHANCY: _ClassVar[Regime]
    REGIME_FAILURE: _ClassVar[Regime]

class ItemStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ITEM_STATUS_UNSPECIFIED: _ClassVar[ItemStatus]
    ITEM_STATUS_OK: _ClassVar[ItemStatus]
    ITEM_STATUS_POLICY_INVALID: _ClassVar[ItemStatus]
TASK_UNSPECIFIED: Task
TASK_GENERIC: Task
TASK_AMAZON: Task
TASK_NEWS: Task
TASK_REDDIT: Task
PARL_VARIANT_UNSPECIFIED: ParlVariant
PARL_VARIANT_0: ParlVariant
PARL_VARIANT_A: ParlVariant
PARL_VARIANT_B: ParlVariant
RUBRIC_AGGREGATE_UNSPECIFIED: RubricAggregate
RUBRIC_AGGREGATE_MEAN_P_YES: RubricAggregate
RUBRIC_AGGREGATE_FRACTION_SATISFIED: RubricAggregate
RUBRIC_AGGREGATE_ALL_SATISFIED: RubricAggregate
NLI_REWARD_FUNCTION_UNSPECIFIED: NliRewardFunction
NLI_REWARD_FUNCTION_REGIME: NliRewardFunction
NLI_REWARD_FUNCTION_ALIGNED_ONLY: NliRewardFunction
NLI_REWARD_FUNCTION_PRODUCT: NliRewardFunction
NLI_REWARD_FUNCTION_WEIGHTED_SUM: NliRewardFunction
REGIME_UNSPECIFIED: Regime
REGIME_PERSONALIZATION: Regime
REGIME_GENERALIZATION: Regime
REGIME_SYCOPHANCY: Regime
REGIME_FAILURE: Regime
ITEM_STATUS_UNSPECIFIED: ItemStatus
ITEM_STATUS_OK: ItemStatus
ITEM_STATUS_POLICY_INVALID: ItemStatus

class HistoryItem(_message.Message):
    __slots__ = ("context", "text")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    context: str
    text: str
    def __init__(self, context: _Optional[str] = ..., text: _Optional[str] = ...) -> None: ...

class RubricScore(_message.Message):
    __slots__ = ("context", "text", "rules", "task", "aggregate")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    AGGREGATE_FIELD_NUMBER: _ClassVar[int]
    context: str
    text: str
    rules: _containers.RepeatedScalarFieldContainer[str]
    task: Task
    aggregate: RubricAggregate
    def __init__(self, context: _Optional[str] = ..., text: _Optional[str] = ..., rules: _Optional[_Iterable[str]] = ..., task: _Optional[_Union[Task, str]] = ..., aggregate: _Optional[_Union[RubricAggregate, str]] = ...) -> None: ...

class ParlReward(_message.Message):
    __slots__ = ("history", "policy_output", "target", "baselines", "variant", "task")
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    POLICY_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    BASELINES_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    history: _containers.RepeatedCompositeFieldContainer[HistoryItem]
    policy_output: str
    target: HistoryItem
    baselines: _containers.RepeatedScalarFieldContainer[str]
    variant: ParlVariant
    task: Task
    def __init__(self, history: _Optional[_Iterable[_Union[HistoryItem, _Mapping]]] = ..., policy_output: _Optional[str] = ..., target: _Optional[_Union[HistoryItem, _Mapping]] = ..., baselines: _Optional[_Iterable[str]] = ..., variant: _Optional[_Union[ParlVariant, str]] = ..., task: _Optional[_Union[Task, str]] = ...) -> None: ...

class NliConstraints(_message.Message):
    __slots__ = ("response", "answer", "preference", "reward_function")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    PREFERENCE_FIELD_NUMBER: _ClassVar[int]
    REWARD_FUNCTION_FIELD_NUMBER: _ClassVar[int]
    response: str
    answer: str
    preference: str
    reward_function: NliRewardFunction
    def __init__(self, response: _Optional[str] = ..., answer: _Optional[str] = ..., preference: _Optional[str] = ..., reward_function: _Optional[_Union[NliRewardFunction, str]] = ...) -> None: ...

class WeightedPart(_message.Message):
    __slots__ = ("weight", "rubric_score", "parl_reward", "nli_constraints")
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    RUBRIC_SCORE_FIELD_NUMBER: _ClassVar[int]
    PARL_REWARD_FIELD_NUMBER: _ClassVar[int]
    NLI_CONSTRAINTS_FIELD_NUMBER: _ClassVar[int]
    weight: float
    rubric_score: RubricScore
    parl_reward: ParlReward
    nli_constraints: NliConstraints
    def __init__(self, weight: _Optional[float] = ..., rubric_score: _Optional[_Union[RubricScore, _Mapping]] = ..., parl_reward: _Optional[_Union[ParlReward, _Mapping]] = ..., nli_constraints: _Optional[_Union[NliConstraints, _Mapping]] = ...) -> None: ...

class WeightedCombination(_message.Message):
    __slots__ = ("parts",)
    PARTS_FIELD_NUMBER: _ClassVar[int]
    parts: _containers.RepeatedCompositeFieldContainer[WeightedPart]
    def __init__(self, parts: _Optional[_Iterable[_Union[WeightedPart, _Mapping]]] = ...) -> None: ...

class ScoreItem(_message.Message):
    __slots__ = ("id", "rubric_score", "parl_reward", "nli_constraints", "weighted")
    ID_FIELD_NUMBER: _ClassVar[int]
    RUBRIC_SCORE_FIELD_NUMBER: _ClassVar[int]
    PARL_REWARD_FIELD_NUMBER: _ClassVar[int]
    NLI_CONSTRAINTS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTED_FIELD_NUMBER: _ClassVar[int]
    id: str
    rubric_score: RubricScore
    parl_reward: ParlReward
    nli_constraints: NliConstraints
    weighted: WeightedCombination
    def __init__(self, id: _Optional[str] = ..., rubric_score: _Optional[_Union[RubricScore, _Mapping]] = ..., parl_reward: _Optional[_Union[ParlReward, _Mapping]] = ..., nli_constraints: _Optional[_Union[NliConstraints, _Mapping]] = ..., weighted: _Optional[_Union[WeightedCombination, _Mapping]] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ScoreItem]
    def __init__(self, items: _Optional[_Iterable[_Union[ScoreItem, _Mapping]]] = ...) -> None: ...

class ItemResult(_message.Message):
    __slots__ = ("id", "status", "reward", "components", "timings_ms", "message")
    class ComponentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class TimingsMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_MS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    id: str
    status: ItemStatus
    reward: float
    components: _containers.ScalarMap[str, float]
    timings_ms: _containers.ScalarMap[str, float]
    message: str
    def __init__(self, id: _Optional[str] = ..., status: _Optional[_Union[ItemStatus, str]] = ..., reward: _Optional[float] = ..., components: _Optional[_Mapping[str, float]] = ..., timings_ms: _Optional[_Mapping[str, float]] = ..., message: _Optional[str] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ItemResult]
    def __init__(self, results: _Optional[_Iterable[_Union[ItemResult, _Mapping]]] = ...) -> None: ...

class InduceRubricsRequest(_message.Message):
    __slots__ = ("history", "task", "num_samples", "seed")
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    history: _containers.RepeatedCompositeFieldContainer[HistoryItem]
    task: Task
    num_samples: int
    seed: int
    def __init__(self, history: _Optional[_Iterable[_Union[HistoryItem, _Mapping]]] = ..., task: _Optional[_Union[Task, str]] = ..., num_samples: _Optional[int] = ..., seed: _Optional[int] = ...) -> None: ...

class InductionAttempt(_message.Message):
    __slots__ = ("raw_output", "parsed_rules", "valid_rules", "invalid_reason")
    RAW_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    PARSED_RULES_FIELD_NUMBER: _ClassVar[int]
    VALID_RULES_FIELD_NUMBER: _ClassVar[int]
    INVALID_REASON_FIELD_NUMBER: _ClassVar[int]
    raw_output: str
    parsed_rules: _containers.RepeatedScalarFieldContainer[str]
    valid_rules: _containers.RepeatedScalarFieldContainer[str]
    invalid_reason: str
    def __init__(self, raw_output: _Optional[str] = ..., parsed_rules: _Optional[_Iterable[str]] = ..., valid_rules: _Optional[_Iterable[str]] = ..., invalid_reason: _Optional[str] = ...) -> None: ...

class InduceRubricsResponse(_message.Message):
    __slots__ = ("rules", "covered", "attempts", "best_attempt")
    RULES_FIELD_NUMBER: _ClassVar[int]
    COVERED_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    BEST_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    rules: _containers.RepeatedScalarFieldContainer[str]
    covered: bool
    attempts: _containers.RepeatedCompositeFieldContainer[InductionAttempt]
    best_attempt: int
    def __init__(self, rules: _Optional[_Iterable[str]] = ..., covered: _Optional[bool] = ..., attempts: _Optional[_Iterable[_Union[InductionAttempt, _Mapping]]] = ..., best_attempt: _Optional[int] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ("response", "answer", "preference", "evidence")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    PREFERENCE_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    response: str
    answer: str
    preference: str
    evidence: bool
    def __init__(self, response: _Optional[str] = ..., answer: _Optional[str] = ..., preference: _Optional[str] = ..., evidence: _Optional[bool] = ...) -> None: ...

class EvidencePair(_message.Message):
    __slots__ = ("premise_index", "hypothesis_index")
    PREMISE_INDEX_FIELD_NUMBER: _ClassVar[int]
    HYPOTHESIS_INDEX_FIELD_NUMBER: _ClassVar[int]
    premise_index: int
    hypothesis_index: int
    def __init__(self, premise_index: _Optional[int] = ..., hypothesis_index: _Optional[int] = ...) -> None: ...

class ConstraintEvidence(_message.Message):
    __slots__ = ("constraint", "score", "premise_units", "hypothesis_units", "critical_premise", "critical_hypothesis", "pairs")
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    PREMISE_UNITS_FIELD_NUMBER: _ClassVar[int]
    HYPOTHESIS_UNITS_FIELD_NUMBER: _ClassVar[int]
    CRITICAL_PREMISE_FIELD_NUMBER: _ClassVar[int]
    CRITICAL_HYPOTHESIS_FIELD_NUMBER: _ClassVar[int]
    PAIRS_FIELD_NUMBER: _ClassVar[int]
    constraint: str
    score: float
    premise_units: _containers.RepeatedScalarFieldContainer[str]
    hypothesis_units: _containers.RepeatedScalarFieldContainer[str]
    critical_premise: _containers.RepeatedScalarFieldContainer[int]
    critical_hypothesis: _containers.RepeatedScalarFieldContainer[int]
    pairs: _containers.RepeatedCompositeFieldContainer[EvidencePair]
    def __init__(self, constraint: _Optional[str] = ..., score: _Optional[float] = ..., premise_units: _Optional[_Iterable[str]] = ..., hypothesis_units: _Optional[_Iterable[str]] = ..., critical_premise: _Optional[_Iterable[int]] = ..., critical_hypothesis: _Optional[_Iterable[int]] = ..., pairs: _Optional[_Iterable[_Union[EvidencePair, _Mapping]]] = ...) -> None: ...

class VerifyResponse(_message.Message):
    __slots__ = ("s_correct", "s_aligned", "regime", "truncated", "evidence")
    S_CORRECT_FIELD_NUMBER: _ClassVar[int]
    S_ALIGNED_FIELD_NUMBER: _ClassVar[int]
    REGIME_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    s_correct: float
    s_aligned: float
    regime: Regime
    truncated: bool
    evidence: _containers.RepeatedCompositeFieldContainer[ConstraintEvidence]
    def __init__(self, s_correct: _Optional[float] = ..., s_aligned: _Optional[float] = ..., regime: _Optional[_Union[Regime, str]] = ..., truncated: _Optional[bool] = ..., evidence: _Optional[_Iterable[_Union[ConstraintEvidence, _Mapping]]] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("api_version", "server_version", "judge_model", "nli_model", "template_versions", "settings", "components", "fake_engines")
    class TemplateVersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class SettingsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    API_VERSION_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    JUDGE_MODEL_FIELD_NUMBER: _ClassVar[int]
    NLI_MODEL_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    FAKE_ENGINES_FIELD_NUMBER: _ClassVar[int]
    api_version: str
    server_version: str
    judge_model: str
    nli_model: str
    template_versions: _containers.ScalarMap[str, str]
    settings: _containers.ScalarMap[str, str]
    components: _containers.RepeatedCompositeFieldContainer[RewardKindComponents]
    fake_engines: bool
    def __init__(self, api_version: _Optional[str] = ..., server_version: _Optional[str] = ..., judge_model: _Optional[str] = ..., nli_model: _Optional[str] = ..., template_versions: _Optional[_Mapping[str, str]] = ..., settings: _Optional[_Mapping[str, str]] = ..., components: _Optional[_Iterable[_Union[RewardKindComponents, _Mapping]]] = ..., fake_engines: _Optional[bool] = ...) -> None: ...

class RewardComponent(_message.Message):
    __slots__ = ("name", "meaning")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEANING_FIELD_NUMBER: _ClassVar[int]
    name: str
    meaning: str
    def __init__(self, name: _Optional[str] = ..., meaning: _Optional[str] = ...) -> None: ...

class RewardKindComponents(_message.Message):
    __slots__ = ("kind", "components")
    KIND_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    components: _containers.RepeatedCompositeFieldContainer[RewardComponent]
    def __init__(self, kind: _Optional[str] = ..., components: _Optional[_Iterable[_Union[RewardComponent, _Mapping]]] = ...) -> None: ...
