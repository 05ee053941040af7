"""Start (or join) Ray, deploy or attach to the engine applications, hand back adapters."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, TypeVar

import ray
from ray import serve
from ray.serve.handle import DeploymentHandle

from reward_server.backends.base import JudgeEngine, NLIEngine
from reward_server.backends.batching import CoalescingJudge, CoalescingNLI
from reward_server.config import RewardServerConfig
from reward_server.errors import BackendUnavailable, ConfigError
from reward_server.serving._private.adapters import HandleCaller, RayJudge, RayNLI
from reward_server.serving._private.deployments import (
    JudgeDeployment,
    JudgeFactory,
    NLIDeployment,
    NLIFactory,
)
from reward_server.serving.settings import ServingSettings

logger = logging.getLogger(__name__)

Kind = Literal["judge", "nli"]
T = TypeVar("T")
SERVE_NAMESPACE = "serve"  # where Serve names its replica actors


def judge_application(
    config: RewardServerConfig, *, engine_factory: JudgeFactory | None = None
) -> Any:
    """The judge Serve application (a bound JudgeDeployment) built from ``config``."""
    opts = config.serving.judge.deployment_options()
    return JudgeDeployment.options(**opts).bind(  # type: ignore[attr-defined]
        config.judge.model_dump(mode="json"), engine_factory
    )


def nli_application(
    config: RewardServerConfig, *, engine_factory: NLIFactory | None = None
) -> Any:
    """The NLI Serve application (a bound NLIDeployment) built from ``config``."""
    if config.nli_engine.kind == "judge":
        raise ConfigError(
            "nli_engine.kind=judge has no NLI deployment: judge-as-NLI calls the judge "
            "deployment from the ingress; deploy only the judge application"
        )
    opts = config.serving.nli.deployment_options()
    return NLIDeployment.options(**opts).bind(  # type: ignore[attr-defined]
        config.nli_engine.model_dump(mode="json"), engine_factory
    )


def _blocking(fn: Callable[[], T]) -> T:
    """Run a blocking Ray call off the current thread (it may host a running event loop)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(fn).result()


def _wait_running(app: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    status = "absent"
    while time.monotonic() < deadline:
        apps = serve.status().applications
        if app in apps:
            status = str(apps[app].status)
            if status.endswith("RUNNING"):
                return
            if status.endswith("DEPLOY_FAILED"):
                break
        time.sleep(0.5)
    raise BackendUnavailable(
        f"Serve application {app!r} is {status}, not RUNNING, after {timeout_s}s; deploy it "
        "(deploy/serve_config.yaml) or set serving.deploy=true"
    )


def _delete_apps(names: list[str], timeout_s: float = 60.0) -> None:
    """Delete Serve applications together (not one after the other) and wait until gone."""
    if not names:
        return
    for name in names:
        serve.delete(name, _blocking=False)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        apps = serve.status().applications
        if not any(n in apps and not str(apps[n].status).endswith("NOT_STARTED") for n in names):
            return
        time.sleep(0.1)
    logger.warning("Serve applications %s not deleted after %.0fs", names, timeout_s)


class RayEngines:
    """The engines as Ray Serve deployments, seen through JudgeEngine / NLIEngine adapters."""

    def __init__(
        self,
        *,
        judge: RayJudge,
        judge_engine: JudgeEngine,
        nli: NLIEngine,
        ray_nli: RayNLI | None,
        serving: ServingSettings,
        deployed: list[str],
        owns_ray: bool,
        connected_ray: bool,
    ) -> None:
        self.judge: JudgeEngine = judge_engine
        self.nli: NLIEngine = nli
        self._ray_judge = judge
        self._ray_nli = ray_nli
        self._serving = serving
        self._deployed = deployed
        self._owns_ray = owns_ray
        self._connected_ray = connected_ray
        self._closed = False

    @property
    def ray_judge(self) -> RayJudge:
        """The judge adapter itself, without this process's call coalescing in front."""
        return self._ray_judge

    @property
    def ray_nli(self) -> RayNLI | None:
        """The NLI adapter itself (None with nli_engine.kind=judge), without coalescing."""
        return self._ray_nli

    def handle(self, kind: Kind) -> DeploymentHandle[Any]:
        if kind == "judge":
            return self._ray_judge.handle
        if self._ray_nli is None:
            raise ConfigError("nli_engine.kind=judge: there is no NLI deployment")
        return self._ray_nli.handle

    def app_name(self, kind: Kind) -> str:
        return self._serving.app_name(kind)

    def replica_counts(self, kind: Kind) -> dict[str, int]:
        """Replicas of the deployment by state (RUNNING, STARTING, STOPPING, ...)."""
        app = serve.status().applications[self.app_name(kind)]
        counts: dict[str, int] = {}
        for dep in app.deployments.values():
            for state, n in dep.replica_states.items():
                counts[str(state)] = counts.get(str(state), 0) + int(n)
        return counts

    async def batch_stats(self, kind: Kind, *, rounds: int = 10) -> dict[str, dict[str, Any]]:
        """Each running replica's formed batch sizes: ``{replica_id: batch_stats()}``.

        Serve routes each call to one replica, so this asks in rounds of concurrent calls
        until every RUNNING replica has answered (or ``rounds`` run out).
        """
        handle = self.handle(kind)
        want = self.replica_counts(kind).get("RUNNING", 0)
        seen: dict[str, dict[str, Any]] = {}
        for _ in range(rounds):
            answers = await asyncio.gather(
                *(handle.batch_stats.remote() for _ in range(max(4, 4 * want))),
                return_exceptions=True,
            )
            for a in answers:
                if isinstance(a, dict):
                    seen[a["replica_id"]] = a
            if len(seen) >= want:
                break
        return seen

    def shutdown(self) -> None:
        """Delete the applications this process deployed (unless they live on an external
        cluster, where they are shared), then stop or leave Ray as appropriate."""
        if self._closed:
            return
        self._closed = True
        if self._ray_nli is not None:
            self._ray_nli._pool.shutdown(wait=False)
        try:
            if not self._connected_ray:
                _blocking(lambda: _delete_apps(self._deployed))
            if self._owns_ray:
                _blocking(serve.shutdown)
        finally:
            if self._owns_ray or self._connected_ray:
                ray.shutdown()


def _ensure_ray(serving: ServingSettings) -> tuple[bool, bool]:
    """(owns_ray, connected_ray): started a local Ray here / joined an external cluster here."""
    if ray.is_initialized():
        return False, False
    address = serving.ray_address or os.environ.get("RAY_ADDRESS")
    if address:
        logger.info("joining Ray cluster at %s (namespace %s)", address, serving.namespace)
        ray.init(address=address, namespace=serving.namespace)
        return False, True
    logger.info("starting an embedded local Ray")
    ray.init(
        num_cpus=serving.local_num_cpus,
        num_gpus=serving.local_num_gpus,
        namespace=serving.namespace,
        include_dashboard=False,
    )
    return True, False


def _deploy_or_attach(
    app: Any, name: str, serving: ServingSettings, deployed: list[str]
) -> DeploymentHandle[Any]:
    if serving.deploy:
        logger.info("deploying Serve application %s", name)
        deployed.append(name)  # before serve.run: a failed deploy is cleaned up too
        return _blocking(lambda: serve.run(app, name=name, route_prefix=None))
    _blocking(lambda: _wait_running(name, serving.ready_timeout_s))
    logger.info("attached to running Serve application %s", name)
    return _blocking(lambda: serve.get_app_handle(name))


def _caller(handle: DeploymentHandle[Any], kind: Kind, serving: ServingSettings) -> HandleCaller:
    return HandleCaller(
        handle,
        deployment=kind,
        items_per_call=getattr(serving, kind).items_per_call,
        timeout_s=serving.call_timeout_s,
        max_retries=serving.max_retries,
    )


def _info(handle: DeploymentHandle[Any], timeout_s: float) -> dict[str, Any]:
    out: dict[str, Any] = _blocking(lambda: handle.info.remote().result(timeout_s=timeout_s))
    return out


def start_engines(
    config: RewardServerConfig,
    *,
    judge_factory: JudgeFactory | None = None,
    nli_factory: NLIFactory | None = None,
) -> RayEngines:
    """See :func:`reward_server.serving.start_engines`."""
    serving = config.serving
    owns_ray, connected = _ensure_ray(serving)
    deployed: list[str] = []
    try:
        if serving.deploy:
            _blocking(lambda: serve.start(proxy_location="Disabled"))
        app = judge_application(config, engine_factory=judge_factory) if serving.deploy else None
        handle = _deploy_or_attach(app, serving.app_name("judge"), serving, deployed)
        ray_judge = RayJudge(
            _caller(handle, "judge", serving),
            model_id=str(_info(handle, serving.ready_timeout_s)["model_id"]),
        )
        judge: JudgeEngine = ray_judge
        wait_s = serving.coalesce_wait_ms / 1000
        if wait_s > 0:
            judge = CoalescingJudge(
                ray_judge, max_batch=serving.judge.items_per_call, max_wait_s=wait_s
            )
        nli: NLIEngine
        ray_nli: RayNLI | None = None
        if config.nli_engine.kind == "judge":  # judge-as-NLI over the judge deployment
            from reward_server.backends.factory import build_nli

            nli = build_nli(config.nli_engine, judge=judge)
        else:
            app = nli_application(config, engine_factory=nli_factory) if serving.deploy else None
            handle = _deploy_or_attach(app, serving.app_name("nli"), serving, deployed)
            info = _info(handle, serving.ready_timeout_s)
            nli = ray_nli = RayNLI(
                _caller(handle, "nli", serving),
                model_id=str(info["model_id"]),
                max_length=int(info["max_length"]),
                timeout_s=serving.call_timeout_s,
            )
            if wait_s > 0:
                nli = CoalescingNLI(
                    ray_nli, max_batch=serving.nli.items_per_call, max_wait_s=wait_s
                )
    except BaseException:
        if not connected:
            _blocking(lambda: _delete_apps(deployed))
        if owns_ray:
            _blocking(serve.shutdown)
            ray.shutdown()
        raise
    return RayEngines(
        judge=ray_judge,
        judge_engine=judge,
        nli=nli,
        ray_nli=ray_nli,
        serving=serving,
        deployed=deployed,
        owns_ray=owns_ray,
        connected_ray=connected,
    )
