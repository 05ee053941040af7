"""The composition root: configuration -> engines -> service -> gRPC server (and the HTTP/JSON
door when ``server.http.port`` is set).

Everything that runs a reward server builds it here: ``reward-server serve``, the tests and the
benchmarks::

    app = await start_app(load_config("deploy/cpu_local.yaml"))
    target = app.target          # host:port the gRPC server listens on
    http_port = app.http_port    # the HTTP/JSON door's port (None: off)
    await app.stop()             # drain, stop, close the engines

The Serve application builders named by ``deploy/serve_config.yaml`` and the KubeRay
RayService (``import_path: reward_server.app:judge_app``) live here too: they read the same
configuration and hand its sections to the hosting layer.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from reward_server import tracing
from reward_server.backends.base import Health
from reward_server.compose import (
    SERVER_GC_THRESHOLDS,
    LocalService,
    build_service,
    engine_batches,
    tune_gc_for_serving,
)
from reward_server.config import RewardServerConfig, load_config
from reward_server.errors import ConfigError
from reward_server.metrics import MetricsServer
from reward_server.rpc.backend import LocalBackend
from reward_server.rpc.forwarding import ForwardBackend
from reward_server.rpc.http import HttpDoor
from reward_server.rpc.server import SHARE_PORT_HINT, RewardGrpcServer, create_server
from reward_server.rpc.settings import host_port
from reward_server.service import Admission
from reward_server.serving import JudgeFactory, NLIFactory, start_engines

__all__ = [
    "SERVER_GC_THRESHOLDS", "Hosting", "LocalService", "RewardApp", "build_service",
    "check_port_free", "engine_batches", "judge_app", "nli_app", "service_app", "start_app",
    "tune_gc_for_serving",
]

logger = logging.getLogger(__name__)


class Hosting(Protocol):
    """What serves a started server's calls behind its doors: the service in this process over
    its engines (:class:`~reward_server.compose.LocalService`), or the service replicas the calls
    are forwarded to (``serving.ray.layout: service``,
    :class:`~reward_server.serving._private.service_host.ServiceHost`). Its health drives the
    server's; it closes last."""

    async def health(self) -> Mapping[Any, Health]: ...

    async def close(self) -> None: ...


@dataclass
class RewardApp:
    """A started reward server: what serves its calls (``hosting``), its gRPC server and its
    HTTP/JSON door."""

    config: RewardServerConfig
    hosting: Hosting
    server: RewardGrpcServer
    port: int
    http: HttpDoor | None = None
    metrics: MetricsServer | None = None

    @property
    def target(self) -> str:
        return host_port(self.config.server.host, self.port)

    @property
    def http_port(self) -> int | None:
        return None if self.http is None else self.http.port

    @property
    def metrics_port(self) -> int | None:
        """The metrics port bound (None: off)."""
        return None if self.metrics is None else self.metrics.port

    async def _close(self) -> None:
        try:
            if self.http is not None:
                await self.http.stop()
        finally:
            if self.metrics is not None:
                self.metrics.close()
            await self.hosting.close()

    async def wait_for_termination(self) -> None:
        """Until a drain (SIGTERM, SIGINT or :meth:`stop`) has finished; then closes the HTTP
        door and the hosting (the engines, or the service replicas' handles)."""
        try:
            await self.server.wait_for_termination()
        finally:
            await self._close()

    async def stop(self, grace: float | None = None, *, drain_delay: float | None = None) -> None:
        """Drain (see :meth:`RewardGrpcServer.stop`; the HTTP door shares its gate, so its calls
        are drained too), stop the HTTP door, then close the hosting."""
        try:
            await self.server.stop(grace, drain_delay=drain_delay)
        finally:
            await self._close()


async def start_app(
    config: RewardServerConfig,
    *,
    judge_factory: JudgeFactory | None = None,
    nli_factory: NLIFactory | None = None,
) -> RewardApp:
    """Start the engines (blocking while models load), build the service, start serving.

    ``judge_factory`` / ``nli_factory`` replace the engine factories (tests, benchmarks).
    """
    shared = config.server.reuse_port
    # before minutes of model loading
    check_port_free(config.server.host, config.server.port, reuse_port=shared)
    http = config.server.http
    if http.port is not None:
        check_port_free(http.host or config.server.host, http.port, reuse_port=shared,
                        setting="--http-port / server.http.port or server.http.host")
    if config.server.metrics_port is not None:
        check_port_free(config.server.host, config.server.metrics_port,
                        setting="server.metrics_port (null: no metrics port)")
    tracing.configure(enabled=config.server.tracing.enabled,
                      otlp_endpoint=config.server.tracing.otlp_endpoint)
    if config.serving.mode == "ray" and config.serving.ray.layout == "service":
        return await _start_forwarding(config, judge_factory=judge_factory,
                                       nli_factory=nli_factory)
    engines = start_engines(
        config.engines, config.serving, judge_factory=judge_factory, nli_factory=nli_factory
    )
    try:
        local = LocalService.build(config, engines)
        server, port = create_server(config.server, LocalBackend(local.service, config.server),
                                     health_probe=local.health)
        door, metrics_server = await _serve(config, server)
    except BaseException:
        await engines.close()
        raise
    logger.info(
        "reward server listening on %s:%d (judge=%s, nli=%s, serving=%s%s)",
        config.server.host, port, engines.judge.model_id, engines.nli.model_id,
        config.serving.mode, ", FAKE ENGINES" if config.engines.fake else "",
    )
    return RewardApp(config=config, hosting=local, server=server, port=port, http=door,
                     metrics=metrics_server)


async def _serve(
    config: RewardServerConfig, server: RewardGrpcServer
) -> tuple[HttpDoor | None, MetricsServer | None]:
    """Start ``server``, the metrics port and the HTTP/JSON door; on failure what started
    stops again."""
    metrics_server: MetricsServer | None = None
    try:
        if config.server.metrics_port is not None:
            metrics_server = MetricsServer(config.server.metrics_port, addr=config.server.host)
        door = None
        if config.server.http.port is not None:
            door = HttpDoor(config.server, server.servicer, server.monitor)
        await server.start()
        if door is not None:
            try:
                await door.start()
            except BaseException:
                await server.stop(0, drain_delay=0)
                raise
    except BaseException:
        if metrics_server is not None:
            metrics_server.close()
        raise
    return door, metrics_server


async def _start_forwarding(
    config: RewardServerConfig, *, judge_factory: JudgeFactory | None,
    nli_factory: NLIFactory | None,
) -> RewardApp:
    """``serving.ray.layout: service``: deploy (or attach to) the service replicas and serve
    a gRPC ingress that forwards each call to one of them (:mod:`reward_server.rpc.forwarding`)."""
    from reward_server.service_deployment import service_application
    from reward_server.serving._private.service_host import start_service_host

    ray_settings = config.serving.ray
    application = None
    if ray_settings.deploy:
        application = service_application(config, judge_factory=judge_factory,
                                          nli_factory=nli_factory)
    host = start_service_host(ray_settings, application, engines=config.engines)
    try:
        admitted = config.service.admission
        admission = Admission(max_judgments=None, max_bytes=(
            admitted.max_request_bytes_in_flight if admitted.enabled else None))
        backend = ForwardBackend(host.forward, config.server, admission=admission)
        server, port = create_server(config.server, backend, health_probe=host.health)
        door, metrics_server = await _serve(config, server)
    except BaseException:
        await host.close()
        raise
    logger.info("reward server listening on %s:%d, forwarding to Serve application %s "
                "(judge=%s, serving=ray, layout=service%s)", config.server.host, port,
                host.app_name, host.model_id, ", FAKE ENGINES" if config.engines.fake else "")
    return RewardApp(config=config, hosting=host, server=server, port=port, http=door,
                     metrics=metrics_server)


def check_port_free(
    host: str, port: int, *, reuse_port: bool = False,
    setting: str = "--port / server.port or --host / server.host",
) -> None:
    """ConfigError now if ``host:port`` cannot be bound (0: any port, nothing to check);
    the message names ``setting``, where to choose another. ``reuse_port``: bound with
    SO_REUSEPORT, as ``server.reuse_port`` binds (a listener that set it too does not count)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # as every server socket: a restart on the same port must not trip over the previous
        # run's TIME_WAIT connections (a live listener still makes the bind fail)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            probe.bind((host, port))
        except OSError as e:
            shared = "" if reuse_port else SHARE_PORT_HINT
            raise ConfigError(
                f"cannot bind {host}:{port} ({e.strerror}): the port is in use or the address is "
                f"not this machine's; choose another with {setting} (0 picks a free port){shared}"
            ) from None


# ------------------------------------------------------------------- Ray Serve applications
def serve_config(args: dict[str, Any]) -> RewardServerConfig:
    unknown = set(args) - {"config", "overrides"}
    if unknown:
        raise ConfigError(
            f"Serve application args {sorted(unknown)} are unknown; use 'config' (a YAML path) "
            "and 'overrides' (a list of section.field=value)"
        )
    overrides = args.get("overrides") or []
    if isinstance(overrides, str):
        overrides = [overrides]
    return load_config(args.get("config"), overrides=list(overrides))


def judge_app(args: dict[str, Any]) -> Any:
    """The judge Serve application (for ``serve deploy``; ``args``: config, overrides).

    Deployment options in the Serve config file's ``deployments:`` section take precedence over
    the ones derived from ``serving.ray.judge`` here (Serve's rule: config file over code).
    """
    from reward_server.serving._private.runtime import judge_application

    config = serve_config(args)
    return judge_application(config.engines, config.serving.ray)


def nli_app(args: dict[str, Any]) -> Any:
    """The NLI Serve application (for ``serve deploy``; ``args``: config, overrides)."""
    from reward_server.serving._private.runtime import nli_application

    config = serve_config(args)
    return nli_application(config.engines, config.serving.ray)


def service_app(args: dict[str, Any]) -> Any:
    """The service Serve application of ``serving.ray.layout: service`` (for ``serve
    deploy``; ``args``: config, overrides): replicas that each run the whole service."""
    from reward_server.service_deployment import service_application

    return service_application(serve_config(args))
