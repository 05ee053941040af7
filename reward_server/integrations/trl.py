"""TRL: the reward server as a GRPO reward function.

    from trl import GRPOConfig, GRPOTrainer
    from reward_server.integrations.trl import RewardServerReward

    reward = RewardServerReward("127.0.0.1:50051")
    trainer = GRPOTrainer(model=..., reward_funcs=[reward], args=GRPOConfig(...),
                          train_dataset=Dataset.from_parquet("data/pg/trl_train.parquet"))

The dataset needs the column ``extra_info_json`` (one JSON object per prompt, written by
``python -m trainer.data.prepare``; see :mod:`reward_server.api.rows`). TRL
repeats it for each completion and passes it as a keyword argument.

:class:`RewardServerReward` is an async callable, so TRL (1.16+) awaits it on its own event
loop, concurrently with its other async reward functions. Each call sends ONE Score request
holding every completion of the generation batch. It logs, through TRL's ``log_metric``, the
mean of each fixed component of the rows' items (``reward/s_target``, ``reward/gamma``, ...;
:attr:`reward_server.api.rows.Row.component_names`, a weighted row's parts' own), the
share of policy-invalid outputs (``reward/policy_invalid``), of masked samples
(``reward/masked``) and the seconds the trainer waited for the rewards (``reward/wait_s``). A
component is averaged over the completions it applies to (a policy-invalid output computes
none): never NaN; a component no completion of the batch has is not logged for that batch.

Unless masking, the first call probes the server once (``Info`` within ``probe_timeout_s``, 10 s
by default): a server that is not there fails it in seconds, with one line naming the address,
the status and the fix.

Prefetch (reward off the critical path): a trainer may call :meth:`RewardServerReward.prefetch`
as soon as a batch's completions exist (``trainer.trl_runner`` does, right after generation);
the Score call then runs on TRL's reward loop while the trainer computes the reference model's
log-probs, and the reward function, when TRL calls it for the same completions, only awaits it.
Same completions, same rewards, same update: only the time the call starts moves.
``reward/wait_s`` is then what the trainer still waited; ``reward/score_s`` is the whole call.

A failed call (server away past the retry budget, an engine error) raises with the server's
status by default. With ``mask_infra_failures=True`` it returns ``None`` for those completions
instead: TRL then leaves them out of their group's mean and std and gives them zero advantage.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from reward_server.api.rows import Row, read_row
from reward_server.client import AsyncRewardClient, RetryBudget, RewardCallError, Target
from reward_server.domain import ItemResult, ItemStatus
from reward_server.integrations.probe import PROBE_TIMEOUT_S, probe

logger = logging.getLogger(__name__)
EXTRA_INFO_COLUMN = "extra_info_json"


def completion_text(completion: Any) -> str:
    """TRL passes a conversational completion as a list of messages, a plain one as a string."""
    if isinstance(completion, list) and completion and isinstance(completion[-1], Mapping):
        return str(completion[-1].get("content") or "")
    return str(completion)


def component_means(rows: Sequence[Row], results: Sequence[ItemResult]) -> dict[str, float]:
    """Mean of each fixed component of the rows' items over the results that report it (finite
    values only), and the share of policy-invalid outputs."""
    values: dict[str, list[float]] = {"policy_invalid": []}
    for row, r in zip(rows, results, strict=True):
        values["policy_invalid"].append(1.0 if r.status is ItemStatus.POLICY_INVALID else 0.0)
        for key in row.component_names:
            value = r.components.get(key)
            if value is not None and math.isfinite(value):
                values.setdefault(key, []).append(float(value))
    return {k: sum(v) / len(v) for k, v in values.items() if v}


class RewardServerReward:
    """TRL reward function backed by the reward server (one batched Score call per batch).

    ``target``: ``host:port``, or several (a list or comma-separated: round robin over them,
    see :func:`reward_server.client.channel_target`); ``token``: bearer token (None: no auth); ``retry``: the client's
    budget per call (attempts, backoff cap, deadline); ``mask_infra_failures``: return ``None``
    for completions whose call failed instead of raising. ``metric_prefix`` prefixes what goes
    to ``log_metric``.

    For logs and tests it keeps, per call: ``calls`` (completions sent), ``history`` (the
    logged means) and ``wait_s``; ``masked`` counts masked completions.
    """

    def __init__(
        self,
        target: Target,
        *,
        token: str | None = None,
        retry: RetryBudget | None = None,
        mask_infra_failures: bool = False,
        extra_info_column: str = EXTRA_INFO_COLUMN,
        metric_prefix: str = "reward/",
        name: str = "reward_server",
        probe_timeout_s: float = PROBE_TIMEOUT_S,
    ) -> None:
        self.__name__ = name  # TRL's name for the function in its logs
        self.target = target
        self.token = token
        self.retry = retry or RetryBudget()
        self.mask_infra_failures = mask_infra_failures
        self.extra_info_column = extra_info_column
        self.metric_prefix = metric_prefix
        self.calls: list[int] = []
        self.history: list[dict[str, float]] = []
        self.wait_s: list[float] = []
        self.masked = 0
        self.probe_timeout_s = probe_timeout_s
        self._probed = False
        self._client: AsyncRewardClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._prefetched: _Prefetch | None = None
        self.prefetch_hits = 0

    def _client_here(self) -> AsyncRewardClient:
        """A grpc.aio channel belongs to the loop it was made on: one client per loop."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = AsyncRewardClient(self.target, token=self.token, retry=self.retry)
            self._loop = loop
        return self._client

    async def __call__(
        self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
    ) -> list[float | None]:
        pending = self._take_prefetch(completions, kwargs.get(self.extra_info_column))
        if pending is not None:
            return await pending.result(kwargs.get("log_metric"), self)
        return await self._score(prompts, completions, **kwargs)

    async def _score(
        self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
    ) -> list[float | None]:
        column = kwargs.get(self.extra_info_column)
        if column is None:
            raise ValueError(
                f"the dataset has no {self.extra_info_column!r} column: prepare it with "
                "`python -m trainer.data.prepare` (TRL parquet: trl_train.parquet)"
            )
        rows = [read_row(e, where=self.extra_info_column) for e in column]
        texts = [completion_text(c) for c in completions]
        stamp = time.monotonic_ns()
        items = [r.item(t, item_id=f"{r.user_id}#{i}@{stamp}")
                 for i, (r, t) in enumerate(zip(rows, texts, strict=True))]
        self.calls.append(len(items))
        log_metric: Callable[[str, float], None] | None = kwargs.get("log_metric")
        start = time.perf_counter()  # the whole call, its first-call probe included
        await self._probe_once()
        try:
            results = await self._client_here().score(items)
        except RewardCallError as e:
            self.wait_s.append(time.perf_counter() - start)
            if not self.mask_infra_failures:
                raise
            self.masked += len(items)
            logger.warning("reward masked for %d completions (%d so far): %s %s", len(items),
                           self.masked, e.code.name, e.details)
            self._log({"masked": 1.0, "wait_s": self.wait_s[-1]}, log_metric)
            return [None] * len(items)
        self.wait_s.append(time.perf_counter() - start)
        means = component_means(rows, results)
        self._log({**means, "masked": 0.0, "wait_s": self.wait_s[-1]}, log_metric)
        return [r.reward for r in results]

    def prefetch(
        self, loop: asyncio.AbstractEventLoop, prompts: Sequence[Any], completions: Sequence[Any],
        **kwargs: Any,
    ) -> None:
        """Start scoring ``completions`` now on ``loop`` (the running loop TRL awaits reward
        functions on); the next call for the same completions and rows awaits this one instead
        of sending its own. A prefetch nobody claims is cancelled by the next one."""
        self.cancel_prefetch()
        metrics: dict[str, float] = {}
        kwargs = {k: v for k, v in kwargs.items() if k not in ("log_metric", "log_extra")}
        coro = self._score(prompts, completions, **kwargs, log_metric=metrics.__setitem__)
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        self._prefetched = _Prefetch([completion_text(c) for c in completions],
                                     list(kwargs.get(self.extra_info_column) or ()), future, metrics)

    def cancel_prefetch(self) -> None:
        pending, self._prefetched = self._prefetched, None
        if pending is not None:
            pending.future.cancel()

    def _take_prefetch(self, completions: Sequence[Any], column: Any) -> _Prefetch | None:
        pending, self._prefetched = self._prefetched, None
        if pending is None:
            return None
        if pending.texts == [completion_text(c) for c in completions] and pending.column == list(column or ()):
            self.prefetch_hits += 1
            return pending
        logger.warning("reward prefetch was for other completions; scoring these now")
        pending.future.cancel()
        return None

    async def _probe_once(self) -> None:
        """The start-up probe before the first call: a server that is not there fails within
        ``probe_timeout_s`` with one line (:class:`ServerUnreachable`), not after the call's
        ``retry.deadline_s`` (not with ``mask_infra_failures``: the call's own budget decides)."""
        if self._probed or self.mask_infra_failures:  # masking rides out an absent server
            return
        await probe(self.target, token=self.token, timeout_s=self.probe_timeout_s,
                    address_flag="RewardServerReward's target as", timeout_flag="probe_timeout_s")
        self._probed = True

    def _log(self, means: dict[str, float], log_metric: Callable[[str, float], None] | None) -> None:
        self.history.append(means)
        if callable(log_metric):
            for key, value in means.items():
                log_metric(f"{self.metric_prefix}{key}", value)

    def close(self, timeout_s: float = 10.0) -> None:
        """Close the client on the loop that runs it (TRL's, in its own thread), if still running."""
        self.cancel_prefetch()
        client, loop, self._client, self._loop = self._client, self._loop, None, None
        if client is None or loop is None or loop.is_closed():
            return
        if loop.is_running():
            asyncio.run_coroutine_threadsafe(client.close(), loop).result(timeout_s)
        else:
            loop.run_until_complete(client.close())


class _Prefetch:
    """One prefetched Score call: what it scores, its future, the metrics it logged."""

    def __init__(self, texts: list[str], column: list[Any],
                 future: concurrent.futures.Future[list[float | None]], metrics: dict[str, float]) -> None:
        self.texts, self.column, self.future, self.metrics = texts, column, future, metrics

    async def result(self, log_metric: Callable[[str, float], None] | None,
                     owner: RewardServerReward) -> list[float | None]:
        start = time.perf_counter()
        rewards = await asyncio.wrap_future(self.future)
        waited = time.perf_counter() - start
        score_s = self.metrics.get(f"{owner.metric_prefix}wait_s", owner.wait_s[-1] if owner.wait_s else waited)
        if owner.wait_s:
            owner.wait_s[-1] = waited
        if owner.history:
            owner.history[-1] = {**owner.history[-1], "wait_s": waited, "score_s": score_s}
        if callable(log_metric):
            for key, value in self.metrics.items():
                log_metric(key, waited if key == f"{owner.metric_prefix}wait_s" else value)
            log_metric(f"{owner.metric_prefix}score_s", score_s)
        return rewards
