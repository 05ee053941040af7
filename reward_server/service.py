"""Orchestration: validate, fan out to the science modules, aggregate. Transport- and Ray-agnostic.

The service sees engines only through the protocols of :mod:`reward_server.backends.base`; whether
they run in this process or as Ray Serve deployments is the hosting layer's business. Semantic
validation of a request happens here and nowhere else (structure is checked by the transport's
conversion; the science modules take validated input).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from reward_server import API_VERSION, __version__, components, nli, rubric
from reward_server import domain as d
from reward_server.backends.base import JudgeEngine, NLIEngine
from reward_server.errors import BackendUnavailable, InvalidRequest
from reward_server.nli.settings import NLISettings
from reward_server.rubric.settings import RubricSettings

logger = logging.getLogger(__name__)


class Limits(BaseModel):
    """What one request may carry; more is refused with INVALID_ARGUMENT naming the field."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_batch_items: int = Field(1024, ge=1, description="Most items one Score call may carry.")
    max_text_chars: int = Field(
        32768, ge=1, description="Longest text field (characters) an item may carry."
    )


class ServiceSettings(BaseModel):
    """Request limits and the penalty of a malformed policy output."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy_invalid_penalty: float = Field(
        0.0, description="Reward of an item whose policy output is malformed (empty, over-long, "
        "or for PARL an unparsable rubric); the item's status is POLICY_INVALID. PARL's value: 0."
    )
    limits: Limits = Field(default_factory=Limits)


class _PolicyInvalid(Exception):
    """The policy's own output is unusable (empty or too long): a penalty, not an error."""


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


class RewardService:
    """The four API operations over a judge engine and an NLI engine."""

    def __init__(
        self,
        *,
        judge: JudgeEngine,
        nli: NLIEngine,
        settings: ServiceSettings | None = None,
        rubric_settings: RubricSettings | None = None,
        nli_settings: NLISettings | None = None,
        fake_engines: bool = False,
    ) -> None:
        self.judge = judge
        self.nli = nli
        self.settings = settings or ServiceSettings()
        self.rubric = rubric_settings or RubricSettings()
        self.nlicv = nli_settings or NLISettings()
        self.fake_engines = fake_engines

    # ------------------------------------------------------------------ Score
    async def score(self, items: Sequence[d.ScoreItem]) -> list[d.ItemResult]:
        """One result per item, in order. Raises InvalidRequest for a malformed request."""
        self._validate_batch(items)
        try:
            async with asyncio.TaskGroup() as tg:  # one failure cancels the rest of the batch
                tasks = [tg.create_task(self._score_item(item)) for item in items]
        except BaseExceptionGroup as group:
            raise _first_leaf(group) from None
        if any(t.cancelled() for t in tasks):  # an engine cancelled our call (replica gone?)
            raise BackendUnavailable(
                "an engine call was cancelled before it answered (replica restarting or shutting "
                "down?); retry the call"
            )
        return [t.result() for t in tasks]

    def _validate_batch(self, items: Sequence[d.ScoreItem]) -> None:
        limit = self.settings.limits.max_batch_items
        if not items:
            raise InvalidRequest("items: the batch is empty; send at least one item")
        if len(items) > limit:
            raise InvalidRequest(
                f"items: {len(items)} items exceed service.limits.max_batch_items={limit}; "
                "split the batch or raise the limit"
            )
        seen: dict[str, int] = {}
        for i, item in enumerate(items):
            if item.item_id in seen:
                raise InvalidRequest(
                    f"items[{i}].id: duplicate id {item.item_id!r} (also items[{seen[item.item_id]}]); "
                    "ids must be unique within a request"
                )
            seen[item.item_id] = i
            self._validate_spec(item.spec, f"items[{i}] (id {item.item_id!r})")

    def _text(self, value: str, where: str, *, required: bool = True) -> None:
        if required and not value.strip():
            raise InvalidRequest(f"{where}: must not be empty")
        limit = self.settings.limits.max_text_chars
        if len(value) > limit:
            raise InvalidRequest(
                f"{where}: {len(value)} characters exceed service.limits.max_text_chars={limit}"
            )

    def _validate_spec(self, spec: d.ItemSpec, where: str) -> None:
        if isinstance(spec, d.WeightedSpec):
            if not spec.parts:
                raise InvalidRequest(f"{where}.weighted.parts: needs at least one part")
            for j, part in enumerate(spec.parts):
                if not math.isfinite(part.weight) or part.weight < 0:
                    raise InvalidRequest(
                        f"{where}.weighted.parts[{j}].weight: {part.weight} is not a finite "
                        "non-negative number"
                    )
                if isinstance(part.spec, d.WeightedSpec):  # pragma: no cover - proto forbids it
                    raise InvalidRequest(f"{where}.weighted.parts[{j}]: combinations do not nest")
                self._validate_spec(part.spec, f"{where}.weighted.parts[{j}]")
            if not sum(p.weight for p in spec.parts) > 0:
                raise InvalidRequest(
                    f"{where}.weighted.parts: weights sum to 0; at least one weight must be positive"
                )
        elif isinstance(spec, d.RubricScoreSpec):
            w = f"{where}.rubric_score"
            self._text(spec.context, f"{w}.context", required=False)
            if not spec.rules:
                raise InvalidRequest(f"{w}.rules: needs at least one rule")
            for k, rule in enumerate(spec.rules):
                self._text(rule, f"{w}.rules[{k}]")
        elif isinstance(spec, d.ParlRewardSpec):
            w = f"{where}.parl_reward"
            if not spec.history:
                raise InvalidRequest(f"{w}.history: needs at least one (context, text) item")
            for k, h in enumerate(spec.history):
                self._text(h.context, f"{w}.history[{k}].context", required=False)
                self._text(h.text, f"{w}.history[{k}].text")
            self._text(spec.target.context, f"{w}.target.context", required=False)
            self._text(spec.target.text, f"{w}.target.text")
            if spec.variant is not d.ParlVariant.PARL_0 and not spec.baselines:
                raise InvalidRequest(
                    f"{w}.baselines: PARL-{spec.variant.value} needs at least one baseline output"
                )
            for k, b in enumerate(spec.baselines):
                self._text(b, f"{w}.baselines[{k}]")
        else:
            w = f"{where}.nli_constraints"
            self._text(spec.answer, f"{w}.answer")
            self._text(spec.preference, f"{w}.preference")

    def _check_policy_text(self, value: str, field: str) -> None:
        if not value.strip():
            raise _PolicyInvalid(f"{field} is empty")
        limit = self.settings.limits.max_text_chars
        if len(value) > limit:
            raise _PolicyInvalid(f"{field} has {len(value)} characters, over {limit}")

    async def _leaf(self, spec: d.LeafSpec) -> d.RewardOutcome:
        try:
            if isinstance(spec, d.RubricScoreSpec):
                self._check_policy_text(spec.text, "rubric_score.text")
                outcome = await rubric.score_rubric(self.judge, spec, self.rubric)
            elif isinstance(spec, d.ParlRewardSpec):
                self._check_policy_text(spec.policy_output, "parl_reward.policy_output")
                outcome = await rubric.parl_reward(self.judge, spec, self.rubric)
            else:
                self._check_policy_text(spec.response, "nli_constraints.response")
                outcome = await nli.nli_constraints_reward(self.nli, spec, self.nlicv)
        except _PolicyInvalid as e:
            outcome = d.RewardOutcome(reward=None, policy_invalid=str(e))
        if outcome.policy_invalid is not None:
            penalty = self.settings.policy_invalid_penalty
            return d.RewardOutcome(penalty, outcome.components, outcome.policy_invalid)
        if outcome.reward is None:  # pragma: no cover - science contract
            raise RuntimeError(f"{d.kind_of(spec).value}: no reward and no policy_invalid reason")
        return outcome

    async def _score_item(self, item: d.ScoreItem) -> d.ItemResult:
        start = time.perf_counter()
        if isinstance(item.spec, d.WeightedSpec):
            outcome = await self._weighted(item.spec)
        else:
            outcome = await self._leaf(item.spec)
        if outcome.reward is None or not math.isfinite(outcome.reward):
            raise RuntimeError(f"item {item.item_id!r}: the reward came out as {outcome.reward}")
        elapsed_ms = (time.perf_counter() - start) * 1000.0
        return d.ItemResult(
            item_id=item.item_id,
            status=d.ItemStatus.POLICY_INVALID if outcome.policy_invalid else d.ItemStatus.OK,
            reward=outcome.reward,
            components=dict(outcome.components),
            timings_ms={"total": elapsed_ms},
            message=outcome.policy_invalid or "",
        )

    async def _weighted(self, spec: d.WeightedSpec) -> d.RewardOutcome:
        outcomes = await asyncio.gather(*(self._leaf(p.spec) for p in spec.parts))
        rewards = [float(o.reward) if o.reward is not None else math.nan for o in outcomes]
        total_w = sum(p.weight for p in spec.parts)
        reward = sum(p.weight * r for p, r in zip(spec.parts, rewards, strict=True)) / total_w
        components: dict[str, float] = {}
        invalid: list[str] = []
        for j, (part, o) in enumerate(zip(spec.parts, outcomes, strict=True)):
            components[f"part{j}.reward"] = rewards[j]
            components[f"part{j}.weight"] = part.weight
            components.update({f"part{j}.{k}": v for k, v in o.components.items()})
            if o.policy_invalid:
                invalid.append(f"part{j}: {o.policy_invalid}")
        return d.RewardOutcome(
            reward=reward, components=components, policy_invalid="; ".join(invalid) or None
        )

    # --------------------------------------------------------- InduceRubrics
    async def induce_rubrics(
        self, history: Sequence[d.HistoryItem], *, task: d.Task, num_samples: int, seed: int
    ) -> d.InductionResult:
        if not history:
            raise InvalidRequest("history: needs at least one (context, text) item")
        for k, h in enumerate(history):
            self._text(h.context, f"history[{k}].context", required=False)
            self._text(h.text, f"history[{k}].text")
        if num_samples < 0 or num_samples > 64:
            raise InvalidRequest(f"num_samples: {num_samples} is outside 0..64 (0 = server default)")
        return await rubric.induce_rubrics(
            self.judge,
            history=history,
            task=task,
            settings=self.rubric,
            num_samples=num_samples or None,
            seed=seed,
        )

    # ----------------------------------------------------------------- Verify
    async def verify(
        self, *, response: str, answer: str, preference: str, evidence: bool
    ) -> d.Verification:
        self._text(response, "response")
        self._text(answer, "answer")
        self._text(preference, "preference")
        return await nli.verify(
            self.nli,
            response=response,
            answer=answer,
            preference=preference,
            evidence=evidence,
            settings=self.nlicv,
        )

    # ------------------------------------------------------------------- Info
    def info(self) -> d.ServerInfo:
        r, n, lim = self.rubric, self.nlicv, self.settings.limits
        templates = {**rubric.template_versions(r), **nli.template_versions(n)}
        settings = {
            "rubric.threshold": str(r.threshold),
            "rubric.reward_lambda": str(r.reward_lambda),
            "rubric.margin_k": str(r.margin_k),
            "rubric.cardinality": r.cardinality,
            "rubric.format_floor": str(r.format_floor),
            "rubric.rule_bounds": f"{r.min_rules}..{r.max_rules}",
            "rubric.history_limit": str(r.history_limit),
            "nli.threshold": str(n.threshold),
            "nli.long_premise": n.long_premise,
            "nli.default_reward_function": n.default_reward_function.value,
            "service.policy_invalid_penalty": str(self.settings.policy_invalid_penalty),
            "service.limits.max_batch_items": str(lim.max_batch_items),
            "service.limits.max_text_chars": str(lim.max_text_chars),
            "engines.fake": str(self.fake_engines).lower(),
        }
        return d.ServerInfo(
            api_version=API_VERSION,
            server_version=__version__,
            judge_model=self.judge.model_id,
            nli_model=self.nli.model_id,
            template_versions=templates,
            settings=settings,
            components=components.info(),
            fake_engines=self.fake_engines,
        )
