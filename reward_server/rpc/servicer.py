"""reward.v1.RewardService over :class:`reward_server.service.RewardService`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import grpc

from reward_server import domain as d
from reward_server import metrics
from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server._proto.reward.v1 import reward_pb2_grpc as pb_grpc
from reward_server.errors import BackendUnavailable
from reward_server.rpc import convert
from reward_server.rpc.status import message_for, status_for
from reward_server.service import RewardService

logger = logging.getLogger(__name__)
T = TypeVar("T")
Context = grpc.aio.ServicerContext[Any, Any]


class RewardServicer(pb_grpc.RewardServiceServicer):
    """Converts, enforces the deadline, and maps exceptions through the one status table."""

    def __init__(self, service: RewardService, *, default_timeout_s: float) -> None:
        self._service = service
        self._default_timeout_s = default_timeout_s

    async def _run(self, rpc: str, context: Context, work: Awaitable[T]) -> T:
        remaining = context.time_remaining()
        timeout = self._default_timeout_s if remaining is None else max(0.0, remaining)
        start = time.perf_counter()
        code_name = "OK"
        try:
            try:
                return await asyncio.wait_for(work, timeout=timeout)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # the call itself was cancelled (client gone, server stopping)
                # a cancellation leaked out of an engine: an infrastructure failure
                raise BackendUnavailable(
                    "an engine call was cancelled before it answered; retry the call"
                ) from None
        except Exception as exc:  # mapped to a status below; never turned into a reward
            code = status_for(exc)
            code_name = code.name
            if code is grpc.StatusCode.INTERNAL:
                logger.exception("%s failed with an unexpected error", rpc)
            else:
                logger.info("%s -> %s: %s", rpc, code.name, exc)
            await context.abort(code, message_for(exc))
            raise  # unreachable: abort raises
        finally:
            seconds = time.perf_counter() - start
            metrics.observe_call(rpc, code_name, seconds)
            logger.debug("%s took %.1f ms", rpc, seconds * 1000)

    async def Score(self, request: pb.ScoreRequest, context: Context) -> pb.ScoreResponse:
        async def work() -> pb.ScoreResponse:
            items = [convert.item_from_proto(m, i) for i, m in enumerate(request.items)]
            results = await self._service.score(items)
            for item, result in zip(items, results, strict=True):
                metrics.observe_items(d.kind_of(item.spec).value, result.status.value)
            return pb.ScoreResponse(results=[convert.result_to_proto(r) for r in results])

        return await self._run("Score", context, work())

    async def InduceRubrics(
        self, request: pb.InduceRubricsRequest, context: Context
    ) -> pb.InduceRubricsResponse:
        async def work() -> pb.InduceRubricsResponse:
            task = convert.task_from_proto(request.task, "request")
            result = await self._service.induce_rubrics(
                convert.history_from_proto(request.history),
                task=task,
                num_samples=request.num_samples,
                seed=request.seed,
            )
            return convert.induction_to_proto(result)

        return await self._run("InduceRubrics", context, work())

    async def Verify(self, request: pb.VerifyRequest, context: Context) -> pb.VerifyResponse:
        async def work() -> pb.VerifyResponse:
            v: d.Verification = await self._service.verify(
                response=request.response,
                answer=request.answer,
                preference=request.preference,
                evidence=request.evidence,
            )
            return convert.verification_to_proto(v)

        return await self._run("Verify", context, work())

    async def Info(self, request: pb.InfoRequest, context: Context) -> pb.InfoResponse:
        async def work() -> pb.InfoResponse:
            return convert.info_to_proto(self._service.info())

        return await self._run("Info", context, work())
