"""The grpc.aio ingress: ``create_server(settings, backend, health_probe=) -> (server, port)``.

Standard ``grpc.health.v1`` health that follows the engines (:mod:`reward_server.rpc.health`),
server reflection, optional bearer-token auth and TLS, max message sizes, bounded connections
and streams (HTTP/2 and keepalive channel args, see :func:`channel_options`), a server-side
timeout from the client's deadline, and a graceful drain (:meth:`RewardGrpcServer.stop`):

1. health turns NOT_SERVING and calls are still served for ``drain_delay_s`` (load balancers
   notice and route away);
2. new calls are held, unanswered; every call accepted before has ``grace_period_s`` to finish;
3. once they have, and no new call arrived for a moment while the event loop ran on time, the
   port closes (GOAWAY, no new connection) and the held calls are answered UNAVAILABLE
   ("draining; retry on another replica").

gRPC itself cancels (CANCELLED) calls that reached it but not yet the application when its port
closes. Holding the late calls in step 2 instead of answering them at once keeps a client that
retries at once from having a call in that window, so clients see only OK or UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server.errors import ConfigError
from reward_server.rpc.auth import TokenCheck
from reward_server.rpc.backend import Backend
from reward_server.rpc.connections import ConnectionGuard
from reward_server.rpc.grpc_metrics import Registrar, register
from reward_server.rpc.health import HealthMonitor, Probe
from reward_server.rpc.memory import fix_mmap_threshold
from reward_server.rpc.reflection import reflection_handlers
from reward_server.rpc.servicer import RewardServicer
from reward_server.rpc.settings import ServerSettings, host_port

logger = logging.getLogger(__name__)
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["RewardService"].full_name
SHUTDOWN_STARTED_S = 0.02  # time for grpc's shutdown to close the port and send GOAWAY
QUIET_S = 0.05  # before the port closes: no call arrived for this long, the loop on time ...
QUIET_MAX_S = 1.0  # ... or this long passed
QUIET_STEP_S = 0.01  # how often the quiet wait looks ...
LATE_S = 0.02  # ... and a look this much late means the loop was held: calm starts over


STEP_BOUND_S = 5.0  # a drain step that has not ended this long past its due time is left


async def _bounded(step: Any, timeout_s: float, what: str) -> None:
    """Await ``step`` for at most ``timeout_s``, then go on without it (logged). gRPC's aio
    shutdown was seen, rarely, never to return after failed calls (grpcio 1.85); a drain must
    end all the same, so that SIGTERM exits and a test's server goes away."""
    task = asyncio.ensure_future(step)
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if not done:
        logger.error("%s did not finish within %.1fs; going on without it", what, timeout_s)
        return
    task.result()


class RewardGrpcServer:
    """A started-on-demand grpc.aio server with its live health and its drain."""

    def __init__(
        self,
        server: grpc.aio.Server,
        monitor: HealthMonitor,
        servicer: RewardServicer,
        settings: ServerSettings,
        *,
        health_server: grpc.aio.Server | None = None,
        health_port: int | None = None,
        guard: ConnectionGuard | None = None,
    ) -> None:
        self.server = server
        self.guard = guard  # per-connection limits (rpc/connections.py)
        self.health_server = health_server  # health alone, its own connection slots
        self.health_port = health_port
        self.monitor = monitor
        self.health = monitor.servicer
        self.servicer = servicer
        self._settings = settings
        self._stopping = False
        self._stopped = asyncio.Event()
        self._watch: asyncio.Future[None] | None = None  # the idle memory watch
        self._guard_watch: asyncio.Future[None] | None = None

    async def start(self) -> None:
        await self.server.start()
        if self.health_server is not None:
            await self.health_server.start()
        await self.monitor.start()
        self._watch = asyncio.ensure_future(
            self.servicer.trimmer.watch(lambda: self.servicer.active > 0))
        if self.guard is not None:
            self._guard_watch = asyncio.ensure_future(self.guard.watch())

    async def stop(self, grace: float | None = None, *, drain_delay: float | None = None) -> None:
        """Drain (see the module doc) and stop."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        s = self._settings
        grace = s.grace_period_s if grace is None else grace
        drain_delay = s.drain_delay_s if drain_delay is None else drain_delay
        logger.info("draining: NOT_SERVING, serving for %.1fs, grace %.1fs", drain_delay, grace)
        await _bounded(self.monitor.stop(), STEP_BOUND_S, "stopping the health watcher")
        for watch in (self._watch, self._guard_watch):
            if watch is not None:
                watch.cancel()
        if drain_delay > 0:
            await asyncio.sleep(drain_delay)
        deadline = time.monotonic() + grace
        self.servicer.stop_accepting()
        if not await self.servicer.wait_idle(deadline - time.monotonic()):
            logger.warning("grace period over with %d calls in flight; cancelling them",
                           self.servicer.active)
        await self._quiet(deadline)  # calls sent as the last ones finished are held too
        stopping = asyncio.ensure_future(self.server.stop(max(0.0, deadline - time.monotonic())))
        await asyncio.sleep(SHUTDOWN_STARTED_S)  # the port is closed now ...
        self.servicer.release_parked()  # ... so the held calls may be answered
        await _bounded(stopping, max(0.0, deadline - time.monotonic()) + STEP_BOUND_S,
                       "gRPC's server shutdown")
        if self.health_server is not None:
            await _bounded(self.health_server.stop(0), STEP_BOUND_S, "the health port's shutdown")
        self._stopped.set()
        logger.info("server stopped")

    async def _quiet(self, deadline: float) -> None:
        """Until no call arrived for ``QUIET_S`` while the event loop ran on time (at most
        ``QUIET_MAX_S``). A call that reaches gRPC while the loop is held (a collector pass, a
        busy CPU) reaches our code only when the loop runs again: closing the port at the end
        of such a pause would have gRPC cancel it, so time spent held does not count as quiet."""
        limit = min(deadline, time.monotonic() + QUIET_MAX_S)
        calm_since = time.monotonic()
        while (now := time.monotonic()) < limit:
            if now - max(calm_since, self.servicer.last_arrival) >= QUIET_S:
                return
            await asyncio.sleep(QUIET_STEP_S)
            if time.monotonic() - now > QUIET_STEP_S + LATE_S:
                calm_since = time.monotonic()

    async def wait_for_termination(self) -> None:
        await self._stopped.wait()

    def install_signal_handlers(self) -> None:
        """SIGTERM / SIGINT start a graceful drain (call from the serving event loop)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(self.stop()))


def _credentials(s: ServerSettings) -> grpc.ServerCredentials | None:
    if s.tls_cert_file is None and s.tls_key_file is None:
        return None
    if s.tls_cert_file is None or s.tls_key_file is None:
        raise ConfigError("server.tls_cert_file and server.tls_key_file must be set together")
    try:
        key, cert = s.tls_key_file.read_bytes(), s.tls_cert_file.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read TLS files: {e}") from None
    return grpc.ssl_server_credentials([(key, cert)])


# what a port-in-use error adds when server.reuse_port is off (app.check_port_free says it too)
SHARE_PORT_HINT = "; several server processes share one port only with server.reuse_port=true in each"


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def channel_options(s: ServerSettings) -> list[tuple[str, int]]:
    """The grpc core channel args bounding messages, connections and streams."""
    options = [
        ("grpc.max_receive_message_length", s.max_message_bytes),
        ("grpc.max_send_message_length", s.max_message_bytes),
        ("grpc.so_reuseport", int(s.reuse_port)),
        # identity only unless asked: gRPC refuses a compressed request before inflating it
        ("grpc.compression_enabled_algorithms_bitset", 0b111 if s.compressed_requests else 0b1),
        # gRPC core's stream budget per connection (its CVE-2023-44487 defence): a new stream
        # is refused (REFUSED_STREAM) while the connection's streams still allocated pass
        # max_concurrent_streams plus max_deallocating_streams. Streams a client reset (or
        # whose answer it has) stay allocated until the server has taken and dropped their
        # calls, one at a time, so the headroom bounds what one connection keeps queued for
        # it. Without it (the budget alone) a good client's new streams were refused while
        # Python still held answered ones: 1,352 of 2,048 calls at 512 concurrent on one
        # channel UNAVAILABLE; with it, 0 (and 0 failed streams under 256 and 1,024 closed
        # loops), while a rapid reset that reconnected as soon as it was closed no longer kept
        # gRPC core's queue of calls full: 0 of a well-behaved client's calls CANCELLED (1-6
        # per 20 s without), its peak RSS +21-32 MB instead of +95-125 (grpcio 1.85.1,
        # bench/faults.py --only issue51 --attacks J, measured)
        ("grpc.http.overload_protection", 1),
        ("grpc.http2.max_deallocating_streams", s.max_concurrent_streams),
        ("grpc.server_handshake_timeout_ms", _ms(s.handshake_timeout_s)),
        ("grpc.max_concurrent_streams", s.max_concurrent_streams),
        # calls the core holds until the server takes them (one at a time); past gRPC's own
        # limits (1,000 soft, 3,000 hard) it cancelled them: 123-168 of 2,048 and 1,232-1,348
        # of 4,096 1-item calls sent at once on 16 / 32 connections ended CANCELLED (grpcio
        # 1.85.1, measured; docs/performance-log.md)
        ("grpc.server.max_pending_requests", s.max_pending_calls),
        ("grpc.server.max_pending_requests_hard_limit", s.max_pending_calls),
        ("grpc.keepalive_time_ms", _ms(s.keepalive_time_s)),
        ("grpc.keepalive_timeout_ms", _ms(s.keepalive_timeout_s)),
        # the unanswered ping closes the connection only with this one too (grpc 1.85, measured)
        ("grpc.http2.ping_timeout_ms", _ms(s.keepalive_timeout_s)),
        # ping idle connections as well (a non-reading peer may have no call left)
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", _ms(s.min_client_ping_interval_s)),
    ]
    if s.max_connections is not None:
        # past max_connections + one peer's share: a peer that opens connections faster than
        # the guard looks (rpc/connections.py) does not lock the others out meanwhile
        options.append(("grpc.max_allowed_incoming_connections",
                        s.max_connections + (s.max_connections_per_peer or 0)))
    if s.max_connection_idle_s is not None:
        options.append(("grpc.max_connection_idle_ms", _ms(s.max_connection_idle_s)))
    if s.max_connection_age_s is not None:
        options.append(("grpc.max_connection_age_ms", _ms(s.max_connection_age_s)))
        options.append(("grpc.max_connection_age_grace_ms", _ms(s.grace_period_s)))
    return options


FILES_BESIDES_CONNECTIONS = 512  # engines, logs, the HTTP door, metrics


def _fit_open_files(max_connections: int | None) -> None:
    """Raise the soft open-file limit so that ``max_connections`` sockets fit (a soft limit of
    1,024, common, would stop accepting long before the cap)."""
    try:
        import resource
    except ImportError:  # not POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = (max_connections or 65536) + FILES_BESIDES_CONNECTIONS
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        if new > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        if new < want:
            logger.warning("the open-file limit (hard %d) holds fewer than server.max_connections="
                           "%s connections; raise it (ulimit -n) or lower the setting",
                           hard, max_connections)


def create_server(
    settings: ServerSettings, backend: Backend, *, health_probe: Probe | None = None,
) -> tuple[RewardGrpcServer, int]:
    """Build the server and bind its port (``port=0`` picks a free one); not started.

    ``backend`` runs the calls (:mod:`reward_server.rpc.backend`: the service in this process,
    or a forward to service replicas); ``health_probe`` (``Engines.health``) drives
    grpc.health.v1; None: SERVING until drained.
    """
    s = settings
    _fit_open_files(None if s.max_connections is None else  # both doors' connections
                    s.max_connections + (s.max_connections_per_peer or 0) + s.http.max_connections)
    fix_mmap_threshold(s.malloc_mmap_threshold_bytes)
    # no interceptor: each handler is counted (gRFC A66) and checks the token itself, when it
    # is registered (grpc_metrics.register), so that a refused call costs little
    token = TokenCheck(s.auth_token.get_secret_value()) if s.auth_token is not None else None
    server = grpc.aio.server(options=channel_options(s), maximum_concurrent_rpcs=s.max_concurrent_rpcs)
    health = HealthServicer()
    guard = ConnectionGuard(0, max_connections=s.max_connections, per_peer=s.max_connections_per_peer,
                            max_streams=s.max_concurrent_streams, max_message=s.max_message_bytes,
                            every_s=s.connection_check_s, shared_port=s.reuse_port)
    monitor = HealthMonitor(health, ("", SERVICE_NAME), health_probe, interval_s=s.health_poll_s,
                            conditions=lambda: {"connections": guard.full} if guard.full else {})
    guard.on_full_change = monitor.poke
    servicer = RewardServicer(backend, s, on_engine_failure=monitor.poke)
    register(server, SERVICE_NAME, servicer.handlers(), token=token, guard=guard)
    health_pb2_grpc.add_HealthServicer_to_server(health, Registrar(server))  # open: no token
    if s.reflection:  # open too (tooling)
        names = (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name)
        for name, handlers in reflection_handlers(names).items():
            register(server, name, handlers)
    address = host_port(s.host, s.port)
    creds = _credentials(s)
    try:
        port = server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
    except RuntimeError:  # grpc's "Failed to bind to address"
        port = 0
    if port == 0:
        raise ConfigError(
            f"cannot bind {address}: the port is in use or the address is not this machine's; "
            "choose another with --port / server.port (0 picks a free one) or --host / server.host"
            + ("" if s.reuse_port else SHARE_PORT_HINT)
        )
    logger.info("gRPC server bound to %s:%d (tls=%s, auth=%s)", s.host, port, creds is not None,
                s.auth_token is not None)
    guard.port = port
    health_server, health_port = None, None
    if s.health_port is not None:
        auto = s.health_port == "auto"
        want = (port + 1 if s.port else 0) if auto else int(s.health_port)
        try:
            health_server, health_port = _health_server(s, want, health, creds)
        except ConfigError as e:
            if not auto:
                raise
            logger.warning("%s; grpc.health.v1 is served on the main port only", e)
    return RewardGrpcServer(server, monitor, servicer, s, health_server=health_server,
                            health_port=health_port, guard=guard), port


HEALTH_MAX_CONNECTIONS = 64
HEALTH_IDLE_S = 10.0


def _health_server(
    s: ServerSettings, want: int, health: HealthServicer, creds: grpc.ServerCredentials | None
) -> tuple[grpc.aio.Server, int]:
    """grpc.health.v1 alone on ``server.health_port``: its own gRPC server, hence its own
    connection cap (gRPC counts ``max_allowed_incoming_connections`` per server), so connections
    that hold every slot of the main port leave health checks theirs."""
    options = [("grpc.so_reuseport", int(s.reuse_port)),
               ("grpc.max_allowed_incoming_connections", HEALTH_MAX_CONNECTIONS),
               ("grpc.max_connection_idle_ms", _ms(HEALTH_IDLE_S)),
               ("grpc.server_handshake_timeout_ms", _ms(min(s.handshake_timeout_s, HEALTH_IDLE_S))),
               ("grpc.max_receive_message_length", 4096)]
    server = grpc.aio.server(options=options)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    address = host_port(s.host, want)
    try:
        port = server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
    except RuntimeError:
        port = 0
    if port == 0:
        raise ConfigError(f"cannot bind the health port {address}: in use or not this machine's "
                          "address; choose another server.health_port (0 picks a free one)")
    logger.info("grpc.health.v1 alone on %s:%d (%d connections of its own)", s.host, port,
                HEALTH_MAX_CONNECTIONS)
    return server, port
