"""NLICV constraint verification, regimes and rewards (docs/nlicv.md §1-§2).

``S_c = f("The answer is {response}.", "The content of the answer is about {answer}.")`` and
``S_a`` the same with the preference (templates from :class:`NLISettings`); an empty response,
answer or preference is rendered and scored as the released code does (``nli.empty_text``;
``zero``: 0 without an engine call). Every NLI query of a call (both constraints,
every item, every ablation) goes to the engine in one batched pass; only
``evidence_mode="cumulative"`` needs more passes (one per sentence position).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from reward_server.backends.base import NLIEngine
from reward_server.components import NliConstraints
from reward_server.domain import (
    ConstraintEvidence,
    NliConstraintsSpec,
    NliRewardFunction,
    Regime,
    RewardOutcome,
    Verification,
)
from reward_server.nli.batch import QueryBatch
from reward_server.nli.evidence import EvidencePlan, run_cumulative
from reward_server.nli.settings import TEMPLATE_FIELDS, NLISettings
from reward_server.nli.text import Side

logger = logging.getLogger(__name__)

REGIME_ORDER: tuple[Regime, ...] = (
    Regime.PERSONALIZATION,
    Regime.GENERALIZATION,
    Regime.SYCOPHANCY,
    Regime.FAILURE,
)


@dataclass(frozen=True)
class VerifyInput:
    response: str
    answer: str
    preference: str


def regime_of(s_correct: float, s_aligned: float, tau: float) -> Regime:
    """The confusion-matrix cell (docs/nlicv.md §2); satisfied iff S > tau."""
    c, a = s_correct > tau, s_aligned > tau
    if c and a:
        return Regime.PERSONALIZATION
    if c:
        return Regime.GENERALIZATION
    if a:
        return Regime.SYCOPHANCY
    return Regime.FAILURE


def reward_of(function: NliRewardFunction, v: Verification, settings: NLISettings) -> float:
    """The ``nli_constraints`` reward of a verification under ``function``."""
    if function is NliRewardFunction.REGIME:
        return settings.regime_rewards[v.regime.value]
    if function is NliRewardFunction.ALIGNED_ONLY:
        return v.s_aligned
    if function is NliRewardFunction.PRODUCT:
        return v.s_correct * v.s_aligned
    if function is NliRewardFunction.WEIGHTED_SUM:
        wc, wa = settings.weight_correct, settings.weight_aligned
        return (wc * v.s_correct + wa * v.s_aligned) / (wc + wa)
    raise ValueError(f"unknown NLI reward function {function!r}")


def components_of(v: Verification, settings: NLISettings, *, windowed: bool) -> dict[str, float]:
    tau, c = settings.threshold, NliConstraints
    out = {
        c.S_CORRECT.name: v.s_correct,
        c.S_ALIGNED.name: v.s_aligned,
        c.CORRECT.name: float(v.s_correct > tau),
        c.ALIGNED.name: float(v.s_aligned > tau),
        c.TRUNCATED.name: float(v.truncated),
        c.WINDOWED.name: float(windowed),
    }
    for r in REGIME_ORDER:
        out[c.REGIME[r].name] = float(v.regime is r)
    return out


def _sides(settings: NLISettings, item: VerifyInput) -> tuple[Side, Side, Side]:
    split, blank = settings.sentence_split, settings.empty_text == "released"
    return (
        Side.of(settings.premise_template, "response", item.response, split=split, score_blank=blank),
        Side.of(settings.correct_template, "answer", item.answer, split=split, score_blank=blank),
        Side.of(settings.aligned_template, "preference", item.preference, split=split, score_blank=blank),
    )


async def _verify_many(
    nli: NLIEngine, items: Sequence[VerifyInput], settings: NLISettings, *, evidence: bool
) -> list[tuple[Verification, bool]]:
    batch = QueryBatch(nli, settings)
    sides = [_sides(settings, it) for it in items]
    plans: list[tuple[EvidencePlan, EvidencePlan]] = []
    cumulative = settings.evidence_mode == "cumulative"
    for p, hc, ha in sides:
        batch.add(p, hc)
        batch.add(p, ha)
        if evidence:
            pair_ge, whole = settings.pair_rule == "ge", settings.no_critical == "whole-text"
            pair = (
                EvidencePlan("correct", p, hc, settings.threshold, cumulative=cumulative, pair_ge=pair_ge,
                             whole_text=whole),
                EvidencePlan("aligned", p, ha, settings.threshold, cumulative=cumulative, pair_ge=pair_ge,
                             whole_text=whole),
            )  # fmt: skip
            plans.append(pair)
            for pl in pair:
                batch.add_all(pl.queries())
    await batch.run()
    if evidence and cumulative:
        await run_cumulative([pl for pair in plans for pl in pair], batch)
    out: list[tuple[Verification, bool]] = []
    for k, (p, hc, ha) in enumerate(sides):
        qc, qa = batch.get(p, hc), batch.get(p, ha)
        ev: tuple[ConstraintEvidence, ...] = ()
        if evidence:
            ev = tuple(pl.read(batch) for pl in plans[k])
        v = Verification(
            s_correct=qc.score,
            s_aligned=qa.score,
            regime=regime_of(qc.score, qa.score, settings.threshold),
            truncated=qc.truncated or qa.truncated,
            evidence=ev,
        )
        out.append((v, qc.windowed or qa.windowed))
    logger.debug("verified %d items in %d engine calls", len(items), batch.engine_calls)
    return out


async def verify_batch(
    nli: NLIEngine, items: Sequence[VerifyInput], settings: NLISettings, *, evidence: bool = False
) -> list[Verification]:
    """Verify many items in one engine pass; results in input order."""
    return [v for v, _ in await _verify_many(nli, items, settings, evidence=evidence)]


async def verify(
    nli: NLIEngine,
    *,
    response: str,
    answer: str,
    preference: str,
    evidence: bool,
    settings: NLISettings,
) -> Verification:
    """NLICV on one (response, answer, preference), with ablation evidence when asked."""
    (v,) = await verify_batch(
        nli, [VerifyInput(response, answer, preference)], settings, evidence=evidence
    )
    return v


async def nli_constraints_reward(
    nli: NLIEngine, spec: NliConstraintsSpec, settings: NLISettings
) -> RewardOutcome:
    """The ``nli_constraints`` reward of one item (one engine call)."""
    item = VerifyInput(spec.response, spec.answer, spec.preference)
    ((v, windowed),) = await _verify_many(nli, [item], settings, evidence=False)
    function = spec.reward_function or settings.default_reward_function
    return RewardOutcome(
        reward=reward_of(function, v, settings),
        components=components_of(v, settings, windowed=windowed),
    )


def template_versions(settings: NLISettings) -> dict[str, str]:
    """Provenance: the template version, a digest of the templates actually configured, policies."""
    text = "\n".join(f"{name}={getattr(settings, name)}" for name in sorted(TEMPLATE_FIELDS))
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
    return {
        "nli.constraints": settings.template_version,
        "nli.templates_sha256": digest,
        "nli.long_premise": settings.long_premise,
        "nli.evidence_mode": settings.evidence_mode,
        "nli.sentence_split": settings.sentence_split,
        "nli.pair_rule": settings.pair_rule,
        "nli.no_critical": settings.no_critical,
        "nli.empty_text": settings.empty_text,
    }
