"""Orchestration: validate, admit, fan out to the science modules, aggregate. Transport- and
Ray-agnostic.

The service sees engines only through the protocols of :mod:`reward_server.backends.base`; whether
they run in this process or as Ray Serve deployments is the hosting layer's business. Semantic
validation of a request happens in :mod:`reward_server.service.validation` and nowhere else
(structure is checked by the transport's conversion; the science modules take validated input):
:meth:`RewardService.score` takes only the :class:`ValidatedBatch` it makes (:meth:`validate`,
or :meth:`batch_check` item by item as a transport converts), then admission control
(:mod:`reward_server.service.admission`) decides before any engine work. Each item is scored by
its kind's declaration (:mod:`reward_server.kinds`); the service names no kind itself. Items
start through :func:`reward_server.cooperative.turn`, so fanning out a large batch shares the
event loop with every other call.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from reward_server import API_VERSION, __version__, cooperative, kinds, nli, rubric
from reward_server import domain as d
from reward_server.api import kinds as kind_facts
from reward_server.backends.base import JudgeEngine, NLIEngine
from reward_server.errors import BackendUnavailable
from reward_server.nli.settings import NLISettings
from reward_server.rubric.settings import RubricSettings
from reward_server.service.admission import Admission, Ticket
from reward_server.service.settings import AdmissionSettings, ServiceSettings
from reward_server.service.validation import BatchCheck, Limits, ValidatedBatch, Validator

__all__ = ["Limits", "RewardService", "ServiceSettings", "admission_for"]

logger = logging.getLogger(__name__)
DEFAULT_ENGINE_BATCH_ITEMS = 512  # judge + NLI batching.max_items at their defaults
# service.call_judgments_in_flight None: this many full engine batches. Enough that the engines
# never wait for a large call's next items; all of a 65,536-judgment call at once left the
# server's RSS 15 MB higher after it (docs/operations.md)
CALL_WINDOW_BATCHES = 4


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


def admission_for(
    settings: AdmissionSettings, *, engine_batch_items: int, nli_batch_items: int = 0
) -> Admission:
    """The admission control ``settings`` ask for; ``engine_batch_items``: the items one full
    batch of every engine replica holds (sizes the default judgment limit), ``nli_batch_items``:
    of those, a separate NLI engine's (the default floor then follows the calls' mix)."""
    return Admission.from_settings(
        settings, engine_batch_items=engine_batch_items, nli_batch_items=nli_batch_items
    )


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
        admission: Admission | None = None,
        engine_batch_items: int = DEFAULT_ENGINE_BATCH_ITEMS,
        nli_batch_items: int = 0,
        engine_info: Mapping[str, str] | None = None,
    ) -> None:
        """``engine_batch_items``: the items one full batch of every engine replica holds
        (sizes the default admission and ``call_judgments_in_flight``); ``nli_batch_items``: of
        those, a separate NLI engine's (0: none; see :func:`admission_for`); ``engine_info``:
        engine settings ``Info`` reports (the judge's p_yes read-out and thinking switch)."""
        self.engine_info = dict(engine_info or {})
        self.judge = judge
        self.nli = nli
        self.settings = settings or ServiceSettings()
        self.rubric = rubric_settings or RubricSettings()
        self.nlicv = nli_settings or NLISettings()
        self.fake_engines = fake_engines
        self.validator = Validator(self.settings.limits, self.rubric, self.nlicv)
        self.admission = admission or admission_for(
            self.settings.admission, engine_batch_items=engine_batch_items,
            nli_batch_items=nli_batch_items,
        )
        self.call_window = (
            self.settings.call_judgments_in_flight or CALL_WINDOW_BATCHES * engine_batch_items
        )

    @contextlib.contextmanager
    def _admitted(self, ticket: Ticket | None, judgments: int, *, nli: int = 0) -> Iterator[None]:
        """Hold ``judgments`` (``nli`` of them NLI pairs) on the caller's ticket, or on one of
        our own for this block."""
        held = ticket if ticket is not None else self.admission.enter()
        try:
            held.admit(judgments, nli=nli)
            yield
        finally:
            if ticket is None:
                held.release()

    # ------------------------------------------------------------------ Score
    async def validate(self, items: Sequence[d.ScoreItem]) -> ValidatedBatch:
        """``items`` checked against the limits (InvalidRequest names what is wrong), ready for
        :meth:`score`."""
        return await self.validator.items(items)

    def batch_check(self) -> BatchCheck:
        """A Score batch validated item by item as a transport converts it; its
        :meth:`~BatchCheck.done` is what :meth:`score` takes."""
        return self.validator.batch()

    def largest_request_bytes(self, field_overhead: int) -> dict[str, int]:
        """Per method (InduceRubrics, Verify): no valid request is larger (see
        :meth:`Validator.largest_request_bytes`)."""
        return self.validator.largest_request_bytes(field_overhead)

    async def score(self, batch: ValidatedBatch, *, ticket: Ticket | None = None) -> list[d.ItemResult]:
        """One result per item, in order. Raises Overloaded when admission control refuses the
        batch. ``ticket``: the transport's, holding the request's bytes."""
        with self._admitted(ticket, batch.judgments, nli=batch.nli_pairs):
            try:
                async with asyncio.TaskGroup() as tg:  # one failure cancels the rest of the batch
                    tasks = await self._start_items(tg, batch)
            except BaseExceptionGroup as group:
                raise _first_leaf(group) from None
        if any(t.cancelled() for t in tasks):  # an engine cancelled our call (replica gone?)
            raise BackendUnavailable(
                "an engine call was cancelled before it answered (replica restarting or shutting "
                "down?); retry the call"
            )
        return [t.result() for t in tasks]

    async def _start_items(
        self, tg: asyncio.TaskGroup, batch: ValidatedBatch
    ) -> list[asyncio.Task[d.ItemResult]]:
        """Start the items of ``batch`` in ``tg``, in order, each once the batch's judgments in
        flight leave it room within :attr:`call_window` (one larger than that starts alone)."""
        if batch.judgments <= self.call_window:
            return [tg.create_task(self._score_item(item)) for item in batch.items]
        tasks: list[asyncio.Task[d.ItemResult]] = []
        flying = 0
        room = asyncio.Event()

        def finished(n: int) -> Callable[[object], None]:
            def done(_: object) -> None:
                nonlocal flying
                flying -= n
                room.set()
            return done

        for item, n in zip(batch.items, batch.item_judgments, strict=True):
            while flying and flying + n > self.call_window:
                room.clear()
                await room.wait()  # a failed item cancels this wait with the rest of tg
            task = tg.create_task(self._score_item(item))
            flying += n
            task.add_done_callback(finished(n))
            tasks.append(task)
        return tasks

    async def leaf(self, spec: d.LeafSpec) -> d.RewardOutcome:
        """The outcome of one leaf spec: its kind's score, or the penalty when the policy's
        output is unusable (empty, too long, or what the science calls invalid)."""
        kind = kinds.of(spec)
        problem = self.validator.policy_text_problem(
            kind.response(spec), f"{kind.proto_field}.{kind.response_field}"
        )
        if problem is not None:
            outcome = d.RewardOutcome(reward=None, policy_invalid=problem)
        else:
            outcome = await kind.score(spec, self)
        if outcome.policy_invalid is not None:
            penalty = self.settings.policy_invalid_penalty
            return d.RewardOutcome(penalty, outcome.components, outcome.policy_invalid)
        if outcome.reward is None:  # pragma: no cover - science contract
            raise RuntimeError(f"{kind.proto_field}: no reward and no policy_invalid reason")
        return outcome

    async def _score_item(self, item: d.ScoreItem) -> d.ItemResult:
        await cooperative.turn()  # items start a time slice at a time, not all in one go
        start = time.perf_counter()
        outcome = await kinds.of(item.spec).outcome(item.spec, self)
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

    # --------------------------------------------------------- InduceRubrics
    async def induce_rubrics(
        self,
        history: Sequence[d.HistoryItem],
        *,
        task: d.Task,
        num_samples: int,
        seed: int,
        ticket: Ticket | None = None,
    ) -> d.InductionResult:
        plan = self.validator.induce(history, num_samples=num_samples)
        with self._admitted(ticket, plan.judgments):
            return await rubric.induce_rubrics(
                self.judge,
                history=history,
                task=task,
                settings=self.rubric,
                num_samples=plan.samples,
                seed=seed,
            )

    # ----------------------------------------------------------------- Verify
    async def verify(
        self,
        *,
        response: str,
        answer: str,
        preference: str,
        evidence: bool,
        ticket: Ticket | None = None,
    ) -> d.Verification:
        judgments = self.validator.verify(
            response=response, answer=answer, preference=preference, evidence=evidence
        )
        with self._admitted(ticket, judgments, nli=judgments):
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
        r, n = self.rubric, self.nlicv
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
            **self.limits_info(),
            "engines.fake": str(self.fake_engines).lower(),
            **self.engine_info,
        }
        return d.ServerInfo(
            api_version=API_VERSION,
            server_version=__version__,
            judge_model=self.judge.model_id,
            nli_model=self.nli.model_id,
            template_versions=templates,
            settings=settings,
            components=kind_facts.info(),
            fake_engines=self.fake_engines,
        )

    def limits_info(self) -> dict[str, str]:
        """Every request limit and the admission limits in force ("none": unlimited)."""
        lim, a = self.settings.limits, self.admission
        out = {f"service.limits.{k}": str(getattr(lim, k)) for k in type(lim).model_fields}
        out["service.admission.enabled"] = str(self.settings.admission.enabled).lower()
        out["service.admission.max_judgments_in_flight"] = str(a.cap_judgments or "none")
        out["service.admission.min_judgments_in_flight"] = str(a.min_judgments)
        out["service.admission.max_calls_in_flight"] = str(a.cap_calls or "none")
        out["service.admission.adaptive"] = str(a.adaptive).lower()
        out["service.admission.target_p99_s"] = str(a.target_s or "measured")
        out["service.admission.max_request_bytes_in_flight"] = str(a.max_bytes or "none")
        return out
