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

import gc
import logging
import socket
from dataclasses import dataclass
from typing import Any

from reward_server import tracing
from reward_server.backends.settings import JudgeNLISettings
from reward_server.config import RewardServerConfig, load_config
from reward_server.errors import ConfigError
from reward_server.metrics import MetricsServer
from reward_server.rpc.http import HttpDoor
from reward_server.rpc.server import SHARE_PORT_HINT, RewardGrpcServer, create_server
from reward_server.rpc.settings import host_port
from reward_server.service import RewardService
from reward_server.serving import Engines, JudgeFactory, NLIFactory, start_engines

logger = logging.getLogger(__name__)


def engine_batches(config: RewardServerConfig) -> tuple[int, int]:
    """Items one full batch of every replica of the judge and of a separate NLI engine holds:
    their ``batching.max_items`` times their most replicas on Ray (0 for an engine the config
    does not name; judge-as-NLI sends its pairs to the judge). Sizes the default admission."""
    out = []
    for name in ("judge", "nli"):
        engine = getattr(config.engines, name)
        if engine is None or isinstance(engine, JudgeNLISettings):
            out.append(0)
            continue
        replicas = 1
        if config.serving.mode == "ray":
            replicas = getattr(config.serving.ray, name).max_replicas
        out.append(engine.batching.max_items * replicas)
    return out[0], out[1]


def build_service(config: RewardServerConfig, engines: Engines) -> RewardService:
    """The orchestration layer over ``engines`` with the config's science, limits and
    admission control (sized for the engines, see :func:`engine_batches`)."""
    judge_items, nli_items = engine_batches(config)
    return RewardService(
        judge=engines.judge,
        nli=engines.nli,
        settings=config.service,
        rubric_settings=config.rubric,
        nli_settings=config.nli,
        fake_engines=config.engines.fake,
        engine_batch_items=max(1, judge_items + nli_items),
        nli_batch_items=nli_items,
    )


@dataclass
class RewardApp:
    """A started reward server: its engines, service, gRPC server and HTTP/JSON door."""

    config: RewardServerConfig
    engines: Engines
    service: RewardService
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
            await self.engines.close()

    async def wait_for_termination(self) -> None:
        """Until a drain (SIGTERM, SIGINT or :meth:`stop`) has finished; then closes the HTTP
        door and the engines."""
        try:
            await self.server.wait_for_termination()
        finally:
            await self._close()

    async def stop(self, grace: float | None = None, *, drain_delay: float | None = None) -> None:
        """Drain (see :meth:`RewardGrpcServer.stop`; the HTTP door shares its gate, so its calls
        are drained too), stop the HTTP door, then close the engines."""
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
    engines = start_engines(
        config.engines, config.serving, judge_factory=judge_factory, nli_factory=nli_factory
    )
    metrics_server: MetricsServer | None = None
    try:
        service = build_service(config, engines)
        server, port = create_server(config.server, service, health_probe=engines.health)
        if config.server.metrics_port is not None:
            metrics_server = MetricsServer(config.server.metrics_port, addr=config.server.host)
        door = None
        if http.port is not None:
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
        await engines.close()
        raise
    logger.info(
        "reward server listening on %s:%d (judge=%s, nli=%s, serving=%s%s)",
        config.server.host, port, engines.judge.model_id, engines.nli.model_id,
        config.serving.mode, ", FAKE ENGINES" if config.engines.fake else "",
    )
    return RewardApp(config=config, engines=engines, service=service, server=server, port=port,
                     http=door, metrics=metrics_server)


SERVER_GC_THRESHOLDS = (25_000, 50, 100)  # gc.set_threshold of a serving process (see below)


def tune_gc_for_serving() -> None:
    """Python's cyclic GC as a serving process wants it; call once start-up is done (what
    ``reward-server serve`` does after :func:`start_app`).

    What start-up loaded (modules, models) lives as long as the process: ``gc.freeze()`` keeps
    it out of the full collections, whose pauses would otherwise hold the event loop (health).
    Fewer young collections: with thousands of items in flight (64 calls x 256 items) the
    default thresholds (700, 10, 10) made the collector's passes over the live objects grow
    with the load; measured (bench/scaling.py --per-call 256 --concurrency 16 64 --min-s 15,
    with and without --gc-gen0 50000): server CPU per item 0.254 -> 0.214 ms at 16 and
    0.387 -> 0.237 ms at 64, items/s at 64 2,569 -> 3,699. Garbage reference cycles live
    longer in exchange (the idle trim runs a full collection, rpc/memory.py).

    The young threshold is 25,000, not the 50,000 first measured: each finished call then left
    a reference cycle in gRPC (its call state and the done callbacks it holds), freed only by
    a collection, and a young pass freed all that came since the last one at once (the done
    callbacks' cycles are gone, :func:`reward_server.rpc.grpc_metrics.when_done`; the request
    iterator's remains). In a run
    of bench/faults.py the 50,000 passes held the event loop up to 118 ms (health checks
    queue behind such holds); in a run at 25,000 the longest was 67 ms, at the same
    throughput (bench/scaling.py --per-call 1 256 --concurrency 64 --min-s 15, 256-item
    calls: 3,389 items/s at 50,000, 3,487 at 25,000, 2,838 at 10,000; one run each).
    """
    gc.freeze()
    gc.set_threshold(*SERVER_GC_THRESHOLDS)


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
def _serve_config(args: dict[str, Any]) -> RewardServerConfig:
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

    config = _serve_config(args)
    return judge_application(config.engines, config.serving.ray)


def nli_app(args: dict[str, Any]) -> Any:
    """The NLI Serve application (for ``serve deploy``; ``args``: config, overrides)."""
    from reward_server.serving._private.runtime import nli_application

    config = _serve_config(args)
    return nli_application(config.engines, config.serving.ray)
