"""Python client for reward.v1: ``AsyncRewardClient`` and a thin synchronous ``RewardClient``.

Needs only grpcio and protobuf. Each call has a deadline; calls that fail with UNAVAILABLE or
RESOURCE_EXHAUSTED are retried a bounded number of times with jittered exponential backoff; any
other failure raises :class:`RewardCallError` at once. A failure is never turned into a reward.

    async with AsyncRewardClient("127.0.0.1:50051") as client:
        results = await client.score([ScoreItem(...)])
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, TypeVar

import grpc

from reward_server import domain as d
from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server._proto.reward.v1 import reward_pb2_grpc as pb_grpc
from reward_server.errors import RewardServerError
from reward_server.rpc import convert

logger = logging.getLogger(__name__)
T = TypeVar("T")
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})


class RewardCallError(RewardServerError):
    """A call failed; ``code`` is the gRPC status and ``details`` the server's message."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str, *, attempts: int) -> None:
        self.method = method
        self.code = code
        self.details = details
        self.attempts = attempts
        super().__init__(f"{method} failed with {code.name} after {attempts} attempt(s): {details}")


def backoff_delays(
    max_retries: int, *, base_s: float, cap_s: float, rng: random.Random
) -> list[float]:
    """Full-jitter exponential backoff: attempt k sleeps U(0, min(cap, base * 2**k))."""
    return [rng.uniform(0.0, min(cap_s, base_s * 2**k)) for k in range(max_retries)]


class AsyncRewardClient:
    """Async client. ``target`` is ``host:port``; ``token`` adds ``authorization: Bearer``."""

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 3,
        backoff_base_s: float = 0.1,
        backoff_cap_s: float = 5.0,
        tls_root_cert: bytes | None = None,
        max_message_bytes: int = 64 * 1024 * 1024,
        seed: int | None = None,
    ) -> None:
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ]
        if tls_root_cert is not None:
            creds = grpc.ssl_channel_credentials(root_certificates=tls_root_cert)
            self._channel = grpc.aio.secure_channel(target, creds, options=options)
        else:
            self._channel = grpc.aio.insecure_channel(target, options=options)
        self._stub = pb_grpc.RewardServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.target = target
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self._backoff = (backoff_base_s, backoff_cap_s)
        self._rng = random.Random(seed)
        self.retries_made = 0  # total retries over the client's life (for logs and tests)

    async def __aenter__(self) -> AsyncRewardClient:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close(grace=None)

    async def _call(
        self, method: str, fn: Callable[..., Awaitable[T]], request: Any, timeout_s: float | None
    ) -> T:
        delays = backoff_delays(
            self.max_retries, base_s=self._backoff[0], cap_s=self._backoff[1], rng=self._rng
        )
        attempt = 0
        while True:
            attempt += 1
            try:
                return await fn(
                    request, timeout=timeout_s or self.timeout_s, metadata=self._metadata
                )
            except grpc.aio.AioRpcError as e:
                code = e.code()
                if code in RETRYABLE and delays:
                    delay = delays.pop(0)
                    self.retries_made += 1
                    logger.warning("%s: %s (%s); retry %d in %.2fs", method, code.name,
                                   e.details(), attempt, delay)
                    await asyncio.sleep(delay)
                    continue
                raise RewardCallError(method, code, e.details() or "", attempts=attempt) from None

    async def score(
        self, items: Sequence[d.ScoreItem], *, timeout_s: float | None = None
    ) -> list[d.ItemResult]:
        request = pb.ScoreRequest(items=[convert.item_to_proto(i) for i in items])
        response = await self._call("Score", self._stub.Score, request, timeout_s)
        return [convert.result_from_proto(r) for r in response.results]

    async def induce_rubrics(
        self,
        history: Sequence[d.HistoryItem],
        *,
        task: d.Task = d.Task.GENERIC,
        num_samples: int = 0,
        seed: int = 0,
        timeout_s: float | None = None,
    ) -> d.InductionResult:
        request = pb.InduceRubricsRequest(
            history=[pb.HistoryItem(context=h.context, text=h.text) for h in history],
            task=convert.task_to_proto(task),
            num_samples=num_samples,
            seed=seed,
        )
        response = await self._call("InduceRubrics", self._stub.InduceRubrics, request, timeout_s)
        return convert.induction_from_proto(response)

    async def verify(
        self,
        *,
        response: str,
        answer: str,
        preference: str,
        evidence: bool = False,
        timeout_s: float | None = None,
    ) -> d.Verification:
        request = pb.VerifyRequest(
            response=response, answer=answer, preference=preference, evidence=evidence
        )
        reply = await self._call("Verify", self._stub.Verify, request, timeout_s)
        return convert.verification_from_proto(reply)

    async def info(self, *, timeout_s: float | None = None) -> d.ServerInfo:
        reply = await self._call("Info", self._stub.Info, pb.InfoRequest(), timeout_s)
        return convert.info_from_proto(reply)

    async def health(self, service: str = "", *, timeout_s: float = 5.0) -> str:
        """grpc.health.v1 status name (SERVING, NOT_SERVING, ...); needs grpcio-health-checking."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(self._channel)
        reply = await self._call(
            "Health.Check", stub.Check, health_pb2.HealthCheckRequest(service=service), timeout_s
        )
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


class RewardClient:
    """Synchronous facade over :class:`AsyncRewardClient` (runs a private event loop)."""

    def __init__(self, target: str, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._client: AsyncRewardClient = self._loop.run_until_complete(
            self._make(target, kwargs)
        )

    @staticmethod
    async def _make(target: str, kwargs: dict[str, Any]) -> AsyncRewardClient:
        return AsyncRewardClient(target, **kwargs)

    def __enter__(self) -> RewardClient:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def score(self, items: Sequence[d.ScoreItem], **kw: Any) -> list[d.ItemResult]:
        return self._loop.run_until_complete(self._client.score(items, **kw))

    def induce_rubrics(self, history: Sequence[d.HistoryItem], **kw: Any) -> d.InductionResult:
        return self._loop.run_until_complete(self._client.induce_rubrics(history, **kw))

    def verify(self, **kw: Any) -> d.Verification:
        return self._loop.run_until_complete(self._client.verify(**kw))

    def info(self, **kw: Any) -> d.ServerInfo:
        return self._loop.run_until_complete(self._client.info(**kw))

    def health(self, service: str = "", **kw: Any) -> str:
        return self._loop.run_until_complete(self._client.health(service, **kw))

    def close(self) -> None:
        if not self._loop.is_closed():
            self._loop.run_until_complete(self._client.close())
            self._loop.close()
