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
from typing import Any, Literal

from ray.serve.handle import DeploymentHandle

from reward_server.backends.base import JudgeEngine, NLIEngine
from reward_server.backends.settings import EnginesSettings, JudgeNLISettings
from reward_server.errors import ConfigError
from reward_server.serving._private.adapters import HandleCaller, RayJudge, RayNLI, replica_counts
from reward_server.serving._private.apps import AppsHost, AppsStart, app_info, model_of, start_apps
from reward_server.serving._private.deployments import JudgeDeployment, NLIDeployment
from reward_server.serving._private.watch import AppWatch
from reward_server.serving.engines import Engines, JudgeFactory, NLIFactory, RawEngines
from reward_server.serving.settings import RaySettings

logger = logging.getLogger(__name__)

Kind = Literal["judge", "nli"]


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


class RayHost(AppsHost):
    """The engine applications this process deployed or attached to, the raw adapters over
    their handles (:attr:`raw`, for :func:`~reward_server.serving.start_engines` to batch),
    and their shutdown."""

    def __init__(self, *, ray_judge: RayJudge, ray_nli: RayNLI | None, start: AppsStart) -> None:
        engines = [e for e in (ray_judge, ray_nli) if e is not None]
        super().__init__(callers=[e.caller for e in engines],
                         attached=[e.caller.app for e in engines], start=start)
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


def _caller(handle: DeploymentHandle[Any], kind: Kind, settings: RaySettings) -> HandleCaller:
    return HandleCaller(
        handle,
        deployment=kind,
        app=settings.app_name(kind),
        timeout_s=settings.call_timeout_s,
        max_retries=settings.max_retries,
        transport=settings.transport,
    )


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
    judge_as_nli = isinstance(engines.nli, JudgeNLISettings)
    judge_name, nli_name = settings.app_name("judge"), settings.app_name("nli")
    watches = [AppWatch(judge_name, model_of(engines.judge), "judge")]
    if not judge_as_nli:
        watches.append(AppWatch(nli_name, model_of(engines.nli), "nli"))

    def build() -> dict[str, Any]:
        apps = {judge_name: judge_application(engines, settings, engine_factory=judge_factory)}
        if not judge_as_nli:
            apps[nli_name] = nli_application(engines, settings, engine_factory=nli_factory)
        return apps

    with start_apps(settings) as start:
        handles = start.deploy(build, watches)
        handle = handles[judge_name]
        ray_judge = RayJudge(
            _caller(handle, "judge", settings),
            model_id=str(app_info(handle, settings.ready_timeout_s)["model_id"]),
        )
        ray_nli: RayNLI | None = None
        if not isinstance(engines.nli, JudgeNLISettings):  # judge-as-NLI: over the judge's
            handle = handles[nli_name]
            info = app_info(handle, settings.ready_timeout_s)
            ray_nli = RayNLI(
                _caller(handle, "nli", settings),
                model_id=str(info["model_id"]),
                max_length=int(info["max_length"]),
                batching=engines.nli.batching,
            )
    return RayHost(ray_judge=ray_judge, ray_nli=ray_nli, start=start)
