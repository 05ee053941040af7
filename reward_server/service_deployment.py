"""``serving.ray.layout: service``: the whole reward service as one Ray Serve deployment.

Each replica builds both engines in its own process (as ``serving.mode: inprocess`` would), the
service over them (:func:`~reward_server.compose.build_service`: validation, admission sized by
this replica's engines, scoring) and a :class:`~reward_server.rpc.servicer.RewardServicer`
over it (:class:`~reward_server.rpc.backend.LocalBackend`), and answers
:meth:`ServiceReplica.call`: one reward.v1 call as bytes in, bytes out. The gRPC ingress (the
same servicer over a :class:`~reward_server.rpc.forwarding.ForwardBackend`) sends each call to
one replica: one Ray hop per call, where ``layout: engines`` makes one per engine batch and
parses in the ingress.

The replica runs the service on its own event loop: Serve's default hands every call to a
second thread, and a replica that parses and scores whole calls then waits for the GIL between
the two (measured in docs/performance.md, "One Ray hop per call").

    reward-server serve --ray --set serving.ray.layout=service ...
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from reward_server.compose import LocalService, tune_gc_for_serving
from reward_server.config import RewardServerConfig
from reward_server.errors import BackendUnavailable
from reward_server.rpc.backend import LocalBackend
from reward_server.rpc.servicer import RewardServicer
from reward_server.rpc.status import portable
from reward_server.serving import JudgeFactory, NLIFactory, start_engines

logger = logging.getLogger(__name__)

SEPARATE_THREAD_ENV = "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"
CallArgs = tuple[str, bytes, float, int]  # (method, request bytes, seconds left, attempts)


def replica_config(config: RewardServerConfig) -> dict[str, Any]:
    """What a replica builds itself from: ``config`` with its engines in process (the
    replica is the host), as JSON."""
    return config.model_dump(mode="json", exclude={"logging", "serving"})


class ServiceReplica:
    """One replica: both engines, the service, and its servicer (see the module doc)."""

    def __init__(
        self, config: dict[str, Any], judge_factory: JudgeFactory | None = None,
        nli_factory: NLIFactory | None = None,
    ) -> None:
        cfg = RewardServerConfig.model_validate(config)
        engines = start_engines(cfg.engines, cfg.serving, judge_factory=judge_factory,
                                nli_factory=nli_factory)
        self._local = LocalService.build(cfg, engines)
        self._servicer = RewardServicer(LocalBackend(self._local.service, cfg.server), cfg.server)
        tune_gc_for_serving()
        logger.info("service replica ready: judge %s, nli %s", engines.judge.model_id,
                    engines.nli.model_id)

    def info(self) -> dict[str, Any]:
        return {"model_id": self._local.engines.judge.model_id}

    async def call(self, calls: list[CallArgs]) -> list[bytes]:
        """The one call :class:`~reward_server.serving._private.service_host.ServiceHost` sends
        (a list of one: the engine deployments' call shape) through the servicer: its response
        bytes, or the error as one of ours (same status)."""
        ((rpc, raw, seconds_left, attempts),) = calls
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds_left

        async def receive() -> bytes:
            return raw

        try:
            reply = await self._servicer.call(rpc, receive,
                                              time_remaining=lambda: deadline - loop.time(),
                                              transport="ray", attempts=attempts)
        except Exception as exc:
            raise portable(exc) from None  # logged by the servicer
        return [reply.SerializeToString()]

    async def check_health(self) -> None:
        """Serve's health check: raises while an engine is down (Serve replaces the replica
        after ``health_check_timeout_s``)."""
        down = {n: h.detail for n, h in (await self._local.health()).items() if not h.ok}
        if down:
            raise BackendUnavailable(f"engines down: {down}")


def service_application(
    config: RewardServerConfig, *, judge_factory: JudgeFactory | None = None,
    nli_factory: NLIFactory | None = None,
) -> Any:
    """The service Serve application (a bound deployment of :class:`ServiceReplica`), sized by
    ``serving.ray.service``; the replicas run the service on their own event loop unless
    ``serving.ray.service.env_vars`` sets :data:`SEPARATE_THREAD_ENV`."""
    from ray import serve

    settings = config.serving.ray.service
    settings = settings.model_copy(update={"env_vars": {SEPARATE_THREAD_ENV: "0", **settings.env_vars}})
    opts = settings.deployment_options(max_items=None)
    deployment = serve.deployment(ServiceReplica, name="ServiceDeployment")
    return deployment.options(**opts).bind(replica_config(config), judge_factory, nli_factory)

