"""THE declaration of every reward component: name and meaning, per reward kind.

An :class:`~reward_server.domain.ItemResult` carries, besides its reward, named numbers in
``components``. They are declared here once, and these declarations are their type: the
science writes each name through them (:class:`RubricScore`, :class:`ParlReward`,
:class:`NliConstraints`, :class:`Weighted`; a misspelt one fails mypy, not a test); each kind's
entry in :data:`reward_server.api.kinds.FACTS` names its declarations, from which ``Info``
serves them and every trainer logs the fixed ones, so a rename on the server cannot turn into
silent NaN columns in a training log.

A name with ``{i}`` is a family indexed 0, 1, ... (one per rule, per baseline, per part).
``weighted`` items report, per part ``j``, ``part{j}.reward``, ``part{j}.weight`` and every
component of the part's own kind under ``part{j}.``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from reward_server.domain import Regime

# an indexed family's first this many names are made once, when it is declared, and shared by
# every result: a 1,024-item x 64-rule call built 65,536 fresh "p_yes.{i}" strings (2.3 MB of
# small objects held until its response; tracemalloc), and such allocations in the middle of a
# large call leave Python's small-object arenas larger after it (docs/operations.md)
_SHARED_NAMES = 256


@dataclass(frozen=True)
class Component:
    """One declared component. The science writes a fixed one under :attr:`name` and one of an
    indexed family under :meth:`at`; both come from these declarations, never from a literal."""

    name: str
    meaning: str
    _names: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = tuple(self._make(i) for i in range(_SHARED_NAMES)) if self.indexed else ()
        object.__setattr__(self, "_names", names)

    @property
    def indexed(self) -> bool:
        return "{i}" in self.name

    def _make(self, i: int) -> str:
        return self.name.replace("{i}", str(i))

    def at(self, i: int) -> str:
        """The name of member ``i`` of an indexed family (``p_yes.{i}`` -> ``p_yes.3``)."""
        if not self.indexed:
            raise ValueError(f"component {self.name!r} is not an indexed family")
        return self._names[i] if 0 <= i < len(self._names) else self._make(i)

    def pattern(self) -> re.Pattern[str]:
        return re.compile(re.escape(self.name).replace(re.escape("{i}"), r"\d+") + r"\Z")


class RubricScore:
    """``rubric_score``'s components (:func:`reward_server.rubric.score_rubric`)."""

    MEAN_P_YES = Component("mean_p_yes", "mean over the rules of the judge's p_yes (S in PARL)")
    FRACTION_SATISFIED = Component(
        "fraction_satisfied",
        "share of rules with p_yes > rubric.threshold (>= with threshold_rule=ge)",
    )
    ALL_SATISFIED = Component(
        "all_satisfied", "1 if every rule is satisfied (p_yes > rubric.threshold), else 0"
    )
    N_RULES = Component("n_rules", "number of rules judged")
    P_YES = Component("p_yes.{i}", "the judge's p_yes for rule i")
    ALL: ClassVar[tuple[Component, ...]] = (
        MEAN_P_YES, FRACTION_SATISFIED, ALL_SATISFIED, N_RULES, P_YES,
    )


class ParlReward:
    """``parl_reward``'s components (:func:`reward_server.rubric.parl_reward`)."""

    S_TARGET = Component(
        "s_target", "S(y_T; R): mean p_yes of the user's real text under the surviving rules"
    )
    S_BASELINE = Component("s_baseline.{i}", "S(y_b; R) of baseline output i")
    DELTA = Component("delta.{i}", "s_target - s_baseline.i")
    GAMMA = Component("gamma", "margin product: prod_b sigmoid(k * delta_b)")
    CARDINALITY = Component("cardinality", "C: min(1, |R|/2) or |R|/10 over the surviving rules")
    N_PARSED = Component("n_parsed", "rules parsed from the policy output")
    N_LENGTH_OK = Component("n_length_ok", "parsed rules within the length bounds")
    N_VALID = Component("n_valid", "rules that survived validation on the whole history")
    FLOOR_APPLIED = Component(
        "floor_applied",
        "1 if the reward is a floor (invalid output or rule count out of bounds)",
    )
    ALL: ClassVar[tuple[Component, ...]] = (
        S_TARGET, S_BASELINE, DELTA, GAMMA, CARDINALITY, N_PARSED, N_LENGTH_OK, N_VALID,
        FLOOR_APPLIED,
    )


class NliConstraints:
    """``nli_constraints``' components (:func:`reward_server.nli.nli_constraints_reward`)."""

    S_CORRECT = Component("s_correct", "entailment score of Correct(response, answer)")
    S_ALIGNED = Component("s_aligned", "entailment score of Aligned(response, preference)")
    CORRECT = Component("correct", "1 if s_correct > nli.threshold")
    ALIGNED = Component("aligned", "1 if s_aligned > nli.threshold")
    TRUNCATED = Component("truncated", "1 if a pair did not fit the NLI model and was cut")
    WINDOWED = Component("windowed", "1 if the premise was split into sentence windows")
    REGIME: ClassVar[Mapping[Regime, Component]] = {
        r: Component(f"regime.{r.value}", f"1 if the regime is {r.value}") for r in Regime
    }
    ALL: ClassVar[tuple[Component, ...]] = (
        S_CORRECT, S_ALIGNED, CORRECT, ALIGNED, TRUNCATED, WINDOWED, *REGIME.values(),
    )


class Weighted:
    """``weighted``'s own components; each part's components come under :func:`in_part`."""

    PART_REWARD = Component(
        "part{i}.reward", "reward of part i (the penalty if its policy output was invalid)"
    )
    PART_WEIGHT = Component("part{i}.weight", "weight of part i")
    ALL: ClassVar[tuple[Component, ...]] = (PART_REWARD, PART_WEIGHT)


def in_part(j: int, name: str) -> str:
    """A part's own component ``name`` as the weighted item reports it (``part{j}.<name>``)."""
    return f"part{j}.{name}"


MASK_SUFFIX = "_mask"


def with_masks(names: Sequence[str], values: Mapping[str, float]) -> dict[str, float]:
    """Per name, the sample's value and ``<name>_mask``: 1.0 and the value when the sample has
    a finite one, 0.0 and 0.0 when it has none (the component does not apply, e.g. after a
    policy-invalid output). For logs that frameworks average with a plain mean and that need
    the same keys on every sample (verl's ``reward_extra_info``, OpenRLHF's ``extra_logs``):
    every value is finite, and ``mean(name) / mean(name_mask)`` is the mean over the samples
    the component applies to."""
    out: dict[str, float] = {}
    for name in names:
        value = values.get(name)
        ok = value is not None and math.isfinite(value)
        out[name] = float(value) if ok and value is not None else 0.0
        out[name + MASK_SUFFIX] = 1.0 if ok else 0.0
    return out
