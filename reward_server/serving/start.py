"""The hosting API: ``start_engines(engines, serving) -> Engines``, in-process or on Ray Serve.

    engines = start_engines(config.engines, config.serving)
    service = RewardService(judge=engines.judge, nli=engines.nli, ...)
    ...
    await engines.close()

A host hands back the engines as they run (:class:`~reward_server.serving.engines.RawEngines`),
and this module puts each behind one :class:`~reward_server.serving.batching.Batcher` (the
engine's ``batching`` block), once, the same way in every mode, so the service never sees how
they are hosted:

- ``serving.mode: inprocess`` builds the engines here (:mod:`reward_server.backends.factory`);
- ``serving.mode: ray`` starts or joins Ray, deploys (or attaches to) one Serve application per
  engine and hands back adapters over their handles (:mod:`reward_server.serving._private.runtime`;
  Ray is imported only then). It blocks while models load: call it before serving.

``judge_factory`` / ``nli_factory`` replace the engine factory (in-process: called here; Ray:
pickled to each replica), for tests and benchmarks that need a particular engine.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Literal

from reward_server.backends.base import JudgeEngine, NLIEngine
from reward_server.backends.settings import EnginesSettings, JudgeNLISettings
from reward_server.errors import ConfigError
from reward_server.serving.batching import BatchedJudge, BatchedNLI
from reward_server.serving.engines import (
    EngineName,
    Engines,
    JudgeFactory,
    NLIFactory,
    RawEngines,
    Unconfigured,
    missing_engines,
)
from reward_server.serving.settings import RaySettings, ServingSettings

logger = logging.getLogger(__name__)


def start_engines(
    engines: EnginesSettings,
    serving: ServingSettings,
    *,
    judge_factory: JudgeFactory | None = None,
    nli_factory: NLIFactory | None = None,
    require: Sequence[EngineName] = ("judge", "nli"),
) -> Engines:
    """Build or attach to the engines named by ``engines``, hosted as ``serving`` says.

    An engine in ``require`` that ``engines`` does not name is a ConfigError listing the
    choices; one not required becomes :class:`Unconfigured`.
    """
    problem = missing_engines(engines, require)
    if problem is not None:
        raise ConfigError(problem)
    if engines.fake:
        logger.warning(
            "FAKE ENGINES (judge=%s, nli=%s): deterministic stand-ins, rewards do not come from "
            "a model (Info reports fake_engines=true)",
            engines.judge and engines.judge.kind, engines.nli and engines.nli.kind,
        )
    if serving.mode == "ray":
        if engines.judge is None or engines.nli is None:
            raise ConfigError("serving.mode=ray deploys both engines: set engines.judge and engines.nli")
        from reward_server.serving._private.runtime import RayEngines, start_ray_host

        if judge_factory is None and nli_factory is None:
            _check_models_before_embedded_ray(engines, serving.ray)
        host = start_ray_host(engines, serving.ray, judge_factory=judge_factory, nli_factory=nli_factory)
        judge, nli = _batched(engines, host.raw)
        return RayEngines(judge=judge, nli=nli, host=host)
    judge, nli = _batched(engines, _in_process(engines, judge_factory, nli_factory))
    logger.info("engines in process: judge %s, nli %s", judge.model_id, nli.model_id)
    return Engines(judge=judge, nli=nli)


def _check_models_before_embedded_ray(engines: EnginesSettings, ray_settings: RaySettings) -> None:
    """An embedded Ray runs its replicas on this machine, in this environment: a model that
    cannot be had here fails before Ray starts (10-25 s), in seconds, as in process. A cluster's
    replicas run elsewhere, and an engine whose replicas get HF_* variables of their own
    (``env_vars``) sees another hub: both are left to the replica's own check."""
    import os

    if ray_settings.address or os.environ.get("RAY_ADDRESS") or not ray_settings.deploy:
        return
    from reward_server.backends.factory import check_judge_source, check_nli_source

    def own_hub(kind: Literal["judge", "nli"]) -> bool:
        dep = ray_settings.service if ray_settings.layout == "service" else getattr(ray_settings, kind)
        return any(k.startswith("HF_") for k in dep.env_vars)

    if engines.judge is not None and not own_hub("judge"):
        check_judge_source(engines.judge)
    if engines.nli is not None and not own_hub("nli"):
        check_nli_source(engines.nli)


def _in_process(
    engines: EnginesSettings, judge_factory: JudgeFactory | None, nli_factory: NLIFactory | None
) -> RawEngines:
    """The in-process host: the engines ``engines`` names, built here."""
    from reward_server.backends.factory import build_judge, build_nli

    judge = (judge_factory or build_judge)(engines.judge) if engines.judge is not None else None
    nli = None
    if engines.nli is not None and not isinstance(engines.nli, JudgeNLISettings):
        nli = (nli_factory or build_nli)(engines.nli)
    return RawEngines(judge=judge, nli=nli)


def _batched(engines: EnginesSettings, raw: RawEngines) -> tuple[JudgeEngine, NLIEngine]:
    """Each engine a host returned behind its ``batching`` block (the one batching stage, the
    same in every mode); judge-as-NLI on the batched judge; Unconfigured for the rest."""
    from reward_server.backends.factory import build_nli

    judge: JudgeEngine = Unconfigured("judge")
    if raw.judge is not None and engines.judge is not None:
        judge = BatchedJudge(raw.judge, engines.judge.batching, max_in_flight=raw.judge_in_flight)
    nli: NLIEngine = Unconfigured("nli")
    if isinstance(engines.nli, JudgeNLISettings):  # asks the (batched) judge
        nli = build_nli(engines.nli, judge=judge)
    elif raw.nli is not None and engines.nli is not None:
        nli = BatchedNLI(raw.nli, engines.nli.batching, max_in_flight=raw.nli_in_flight)
    return judge, nli
