"""Start (or join) Ray, deploy or attach to the engine applications, hand back adapters
(:class:`RayHost`; :func:`~reward_server.serving.start_engines` puts the batchers in front).

The ingress side of a call: :class:`~reward_server.serving.batching.Batcher` (the engine's
``batching`` window, pieces of at most ``max_items``) -> one handle call per piece -> the
replica's ``@serve.batch`` (no timer: it joins the calls already queued, up to ``max_items``)
-> the engine.
"""

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
from ray.serve.api import RunTarget
from ray.serve.handle import DeploymentHandle

from reward_server.backends.base import JudgeEngine, NLIEngine
from reward_server.backends.settings import EnginesSettings, JudgeNLISettings
from reward_server.errors import ConfigError
from reward_server.serving._private.adapters import HandleCaller, RayJudge, RayNLI, replica_counts
from reward_server.serving._private.deployments import JudgeDeployment, NLIDeployment
from reward_server.serving._private.watch import AppWatch, wait_apps_running
from reward_server.serving.engines import Engines, JudgeFactory, NLIFactory, RawEngines
from reward_server.serving.ray_cluster import SINGLE_NODE_ENV, check_cluster, is_loopback
from reward_server.serving.settings import RaySettings

logger = logging.getLogger(__name__)

Kind = Literal["judge", "nli"]
T = TypeVar("T")
SERVE_NAMESPACE = "serve"  # where Serve names its replica actors


def judge_application(
    engines: EnginesSettings, ray_settings: RaySettings, *, engine_factory: JudgeFactory | None = None
) -> Any:
    """The judge Serve application (a bound JudgeDeployment)."""
    if engines.judge is None:
        raise ConfigError("engines.judge is not set: there is no judge application to deploy")
    opts = ray_settings.judge.deployment_options(max_items=engines.judge.batching.max_items)
    return JudgeDeployment.options(**opts).bind(  # type: ignore[attr-defined]
        engines.judge.model_dump(mode="json"), engine_factory
    )


def nli_application(
    engines: EnginesSettings, ray_settings: RaySettings, *, engine_factory: NLIFactory | None = None
) -> Any:
    """The NLI Serve application (a bound NLIDeployment)."""
    if engines.nli is None:
        raise ConfigError("engines.nli is not set: there is no NLI application to deploy")
    if isinstance(engines.nli, JudgeNLISettings):
        raise ConfigError(
            "engines.nli.kind=judge has no NLI deployment: judge-as-NLI calls the judge "
            "deployment from the ingress; deploy only the judge application"
        )
    opts = ray_settings.nli.deployment_options(max_items=engines.nli.batching.max_items)
    return NLIDeployment.options(**opts).bind(  # type: ignore[attr-defined]
        engines.nli.model_dump(mode="json"), engine_factory
    )


def _blocking(fn: Callable[[], T]) -> T:
    """Run a blocking Ray call off the current thread (it may host a running event loop)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(fn).result()


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


class AppsHost:
    """The Serve applications this process deployed or attached to (their callers), and
    leaving them: :meth:`close` / :meth:`shutdown`."""

    def __init__(
        self, *, callers: list[HandleCaller], attached: list[str], settings: RaySettings,
        deployed: list[str], owns_ray: bool, connected_ray: bool,
    ) -> None:
        self._callers = callers
        self._attached = attached  # the applications, when attached to (deploy: false)
        self._settings = settings
        self._deployed = deployed
        self._owns_ray = owns_ray
        self._connected_ray = connected_ray
        self._closed = False

    async def close(self) -> None:
        """Shut down the routers of this loop's calls, then :meth:`shutdown`."""
        stopping = not self._closed and (self._owns_ray or self._connected_ray)
        for caller in self._callers:
            await caller.close(ray_stopping=stopping)
        self.shutdown()

    def shutdown(self) -> None:
        """Delete the applications this process deployed (unless
        ``serving.ray.keep_apps_on_exit``), then stop or leave Ray as appropriate."""
        if self._closed:
            return
        self._closed = True
        try:
            attached = [] if self._settings.deploy else self._attached
            _leave_apps(self._deployed, attached, self._settings, owns_ray=self._owns_ray)
            if self._owns_ray:
                _blocking(serve.shutdown)
        finally:
            if self._owns_ray or self._connected_ray:
                ray.shutdown()


class RayHost(AppsHost):
    """The engine applications this process deployed or attached to, the raw adapters over
    their handles (:attr:`raw`, for :func:`~reward_server.serving.start_engines` to batch),
    and their shutdown."""

    def __init__(
        self,
        *,
        ray_judge: RayJudge,
        ray_nli: RayNLI | None,
        settings: RaySettings,
        deployed: list[str],
        owns_ray: bool,
        connected_ray: bool,
    ) -> None:
        engines = [e for e in (ray_judge, ray_nli) if e is not None]
        super().__init__(
            callers=[e.caller for e in engines], attached=[e.caller.app for e in engines],
            settings=settings, deployed=deployed, owns_ray=owns_ray, connected_ray=connected_ray)
        self.ray_judge = ray_judge
        self.ray_nli = ray_nli

    @property
    def raw(self) -> RawEngines:
        """The adapters, with one batch in flight per replica as the batchers' default."""
        return RawEngines(
            judge=self.ray_judge, nli=self.ray_nli,
            judge_in_flight=self._settings.judge.max_replicas,
            nli_in_flight=self._settings.nli.max_replicas,
        )

    def handle(self, kind: Kind) -> DeploymentHandle[Any]:
        if kind == "judge":
            return self.ray_judge.handle
        if self.ray_nli is None:
            raise ConfigError("engines.nli.kind=judge: there is no NLI deployment")
        return self.ray_nli.handle

    def app_name(self, kind: Kind) -> str:
        return self._settings.app_name(kind)


class RayEngines(Engines):
    """The engines as Ray Serve deployments: the batched adapters the service calls, and the
    deployments behind them (:class:`RayHost`)."""

    mode = "ray"

    def __init__(self, *, judge: JudgeEngine, nli: NLIEngine, host: RayHost) -> None:
        super().__init__(judge=judge, nli=nli)
        self.host = host

    @property
    def ray_judge(self) -> RayJudge:
        """The judge adapter itself, without this process's batcher in front."""
        return self.host.ray_judge

    @property
    def ray_nli(self) -> RayNLI | None:
        """The NLI adapter itself (None with engines.nli.kind=judge), without the batcher."""
        return self.host.ray_nli

    def handle(self, kind: Kind) -> DeploymentHandle[Any]:
        return self.host.handle(kind)

    def app_name(self, kind: Kind) -> str:
        return self.host.app_name(kind)

    def replica_counts(self, kind: Kind) -> dict[str, int]:
        """Replicas of the deployment by state (RUNNING, STARTING, STOPPING, ...)."""
        return replica_counts(self.app_name(kind))

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

    async def close(self) -> None:
        self._closed = True
        await self.host.close()

    def shutdown(self) -> None:
        """Stop the engines' hosting (see :meth:`RayHost.shutdown`)."""
        self._closed = True
        self.host.shutdown()


def _leave_apps(
    deployed: list[str], attached: list[str], settings: RaySettings, *, owns_ray: bool
) -> None:
    """On exit: delete the applications this ingress deployed, unless told to keep them (or
    Ray itself goes with this process), and say which it did. Attached ones are never touched."""
    if owns_ray:
        _blocking(lambda: _delete_apps(deployed))
        logger.info("stopping the embedded local Ray with the Serve applications on it: %s",
                    ", ".join(deployed) or "none")
    elif deployed and settings.keep_apps_on_exit:
        logger.info("leaving the Serve applications this ingress deployed RUNNING: %s "
                    "(serving.ray.keep_apps_on_exit=true; remove them with serve.delete(name) in "
                    "Python, or all applications with `serve shutdown`)", ", ".join(deployed))
    elif deployed:
        _blocking(lambda: _delete_apps(deployed))
        logger.info("deleted the Serve applications this ingress deployed: %s "
                    "(serving.ray.keep_apps_on_exit=true keeps them)", ", ".join(deployed))
    if attached:
        logger.info("left the attached Serve applications running (serving.ray.deploy=false "
                    "never deletes): %s", ", ".join(attached))


def _ensure_ray(settings: RaySettings) -> tuple[bool, bool]:
    """(owns_ray, connected_ray): started a local Ray here / joined an external cluster here.

    ``log_to_driver`` is off unless ``serving.ray.log_to_driver``: Serve turns off Ray's
    per-job filter of forwarded worker output in every process that uses it
    (``ray.serve._private.api``: ``_filter_logs_by_job = False``), so with it on the server's
    log would carry the output of every job's workers on the cluster.

    Joining: the cluster's token auth is checked first (a refusal fails in seconds with the
    fix, see :mod:`reward_server.serving.ray_cluster`). Starting: the embedded Ray advertises
    ``local_node_ip`` (127.0.0.1 by default) and runs no dashboard; token auth stays on
    (Ray's default for a cluster it starts, unless ``RAY_AUTH_MODE`` says otherwise).
    """
    if ray.is_initialized():
        return False, False
    address = settings.address or os.environ.get("RAY_ADDRESS")
    if address:
        check_cluster(address)
        logger.info("joining Ray cluster at %s (namespace %s, node %s)", address,
                    settings.namespace, settings.node_temp_dir or "head or any on this host")
        ray.init(address=address, namespace=settings.namespace,
                 log_to_driver=settings.log_to_driver, _temp_dir=settings.node_temp_dir)
        return False, True
    logger.info("starting an embedded local Ray on %s", settings.local_node_ip)
    ray.init(
        num_cpus=settings.local_num_cpus,
        num_gpus=settings.local_num_gpus,
        namespace=settings.namespace,
        include_dashboard=False,
        log_to_driver=settings.log_to_driver,
        _node_ip_address=settings.local_node_ip,
    )
    node_ip = ray.util.get_node_ip_address()
    if is_loopback(settings.local_node_ip) and not is_loopback(node_ip):
        logger.warning(
            "the embedded Ray advertises %s, not %s: its processes listen on the machine's "
            "interfaces, guarded by Ray's token auth. Ray keeps loopback only with %s=0 set "
            "before ray is imported (`reward-server serve` sets it)", node_ip,
            settings.local_node_ip, SINGLE_NODE_ENV)
    return True, False


def _failed_start(deployed: list[str], settings: RaySettings, *, owns_ray: bool) -> None:
    """Start-up failed: leave what it deployed."""
    if owns_ray:  # Ray goes with this process: its applications with it, no waiting
        # for Serve's graceful shutdown of replicas that failed to start (seconds)
        logger.info("stopping the embedded local Ray (Serve applications: %s)",
                    ", ".join(deployed) or "none")
        ray.shutdown()
    else:
        _leave_apps(deployed, [], settings, owns_ray=False)


def _deploy_and_wait(
    apps: dict[str, Any], watches: list[AppWatch], settings: RaySettings, *, owns_ray: bool,
    deployed: list[str],
) -> dict[str, DeploymentHandle[Any]]:
    """Deploy ``apps`` (name -> bound application; empty when attaching) together, wait until
    all of ``watches`` are RUNNING with a progress line per change and a one-line failure
    (:mod:`~reward_server.serving._private.watch`), and return a handle per application."""
    if apps:
        logger.info("deploying Serve applications %s", ", ".join(apps))
        deployed += list(apps)  # before run_many: a failed deploy is cleaned up too
        targets = [RunTarget(target=app, name=name, route_prefix=None) for name, app in apps.items()]
        _blocking(lambda: serve.run_many(targets, wait_for_applications_running=False))
    else:
        logger.info("attaching to Serve applications %s (serving.ray.deploy=false)",
                    ", ".join(w.app for w in watches))
    _blocking(lambda: wait_apps_running(
        watches, timeout_s=settings.ready_timeout_s, fail_fast=bool(apps),
        placement="fail" if owns_ray else "wait"))
    names = [w.app for w in watches]
    return _blocking(lambda: {name: serve.get_app_handle(name) for name in names})


def _model_of(engine: Any) -> str:
    """What the user named as the engine's model (a fake names its model_id)."""
    return str(getattr(engine, "model", None) or getattr(engine, "model_id", None) or engine.kind)


def _caller(handle: DeploymentHandle[Any], kind: Kind, settings: RaySettings) -> HandleCaller:
    return HandleCaller(
        handle,
        deployment=kind,
        app=settings.app_name(kind),
        timeout_s=settings.call_timeout_s,
        max_retries=settings.max_retries,
        transport=settings.transport,
    )


def _info(handle: DeploymentHandle[Any], timeout_s: float) -> dict[str, Any]:
    out: dict[str, Any] = _blocking(lambda: handle.info.remote().result(timeout_s=timeout_s))
    return out


def start_ray_host(
    engines: EnginesSettings,
    settings: RaySettings,
    *,
    judge_factory: JudgeFactory | None = None,
    nli_factory: NLIFactory | None = None,
) -> RayHost:
    """See :func:`reward_server.serving.start_engines` (``serving.mode: ray``): the deployed
    (or attached) applications and the raw adapters over their handles."""
    assert engines.judge is not None and engines.nli is not None  # checked by start_engines
    owns_ray, connected = _ensure_ray(settings)
    deployed: list[str] = []
    judge_as_nli = isinstance(engines.nli, JudgeNLISettings)
    judge_name, nli_name = settings.app_name("judge"), settings.app_name("nli")
    watches = [AppWatch(judge_name, _model_of(engines.judge), "judge")]
    if not judge_as_nli:
        watches.append(AppWatch(nli_name, _model_of(engines.nli), "nli"))
    try:
        apps: dict[str, Any] = {}
        if settings.deploy:
            _blocking(lambda: serve.start(proxy_location="Disabled"))
            apps[judge_name] = judge_application(engines, settings, engine_factory=judge_factory)
            if not judge_as_nli:
                apps[nli_name] = nli_application(engines, settings, engine_factory=nli_factory)
        handles = _deploy_and_wait(apps, watches, settings, owns_ray=owns_ray, deployed=deployed)
        handle = handles[judge_name]
        ray_judge = RayJudge(
            _caller(handle, "judge", settings),
            model_id=str(_info(handle, settings.ready_timeout_s)["model_id"]),
        )
        ray_nli: RayNLI | None = None
        if not isinstance(engines.nli, JudgeNLISettings):  # judge-as-NLI: over the judge's
            handle = handles[nli_name]
            info = _info(handle, settings.ready_timeout_s)
            ray_nli = RayNLI(
                _caller(handle, "nli", settings),
                model_id=str(info["model_id"]),
                max_length=int(info["max_length"]),
                batching=engines.nli.batching,
            )
    except BaseException:
        _failed_start(deployed, settings, owns_ray=owns_ray)
        raise
    return RayHost(
        ray_judge=ray_judge,
        ray_nli=ray_nli,
        settings=settings,
        deployed=deployed,
        owns_ray=owns_ray,
        connected_ray=connected,
    )
