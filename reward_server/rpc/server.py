"""The grpc.aio ingress: ``create_server(settings, service) -> (server, port)``.

Standard ``grpc.health.v1`` health, server reflection, optional bearer-token auth and TLS, max
message sizes, a server-side timeout from the client's deadline, and a graceful drain: health
turns NOT_SERVING, new calls are still accepted for ``drain_delay_s`` (so load balancers notice),
then the server stops accepting and in-flight calls get ``grace_period_s`` to finish.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server._proto.reward.v1 import reward_pb2_grpc as pb_grpc
from reward_server.errors import ConfigError
from reward_server.rpc.auth import BearerTokenInterceptor
from reward_server.rpc.reflection import enable_reflection
from reward_server.rpc.servicer import RewardServicer
from reward_server.rpc.settings import ServerSettings
from reward_server.service import RewardService

logger = logging.getLogger(__name__)
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["RewardService"].full_name


class RewardGrpcServer:
    """A started-on-demand grpc.aio server with its health servicer."""

    def __init__(self, server: grpc.aio.Server, health: HealthServicer, service: RewardService,
                 settings: ServerSettings) -> None:
        self.server = server
        self.health = health
        self.service = service
        self._settings = settings
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        await self.server.start()
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)

    async def _set_health(self, status: int) -> None:
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)

    async def stop(self, grace: float | None = None, *, drain_delay: float | None = None) -> None:
        """Drain: NOT_SERVING, wait drain_delay, stop accepting, let in-flight calls finish."""
        if self._stopped.is_set():
            return
        s = self._settings
        grace = s.grace_period_s if grace is None else grace
        drain_delay = s.drain_delay_s if drain_delay is None else drain_delay
        logger.info("draining: NOT_SERVING, accepting for %.1fs, grace %.1fs", drain_delay, grace)
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        if drain_delay > 0:
            await asyncio.sleep(drain_delay)
        await self.server.stop(grace)
        self._stopped.set()
        logger.info("server stopped")

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


def create_server(
    settings: ServerSettings, service: RewardService
) -> tuple[RewardGrpcServer, int]:
    """Build the server and bind its port (``port=0`` picks a free one); not started."""
    s = settings
    interceptors: list[grpc.aio.ServerInterceptor[Any, Any]] = []
    if s.auth_token is not None:
        interceptors.append(BearerTokenInterceptor(s.auth_token.get_secret_value()))
    options = [
        ("grpc.max_receive_message_length", s.max_message_bytes),
        ("grpc.max_send_message_length", s.max_message_bytes),
        ("grpc.so_reuseport", 0),
    ]
    server = grpc.aio.server(
        interceptors=interceptors,
        options=options,
        maximum_concurrent_rpcs=s.max_concurrent_rpcs,
    )
    pb_grpc.add_RewardServiceServicer_to_server(  # type: ignore[no-untyped-call]
        RewardServicer(service, default_timeout_s=s.default_timeout_s), server
    )
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    if s.reflection:
        enable_reflection(server, (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name))
    address = f"{s.host}:{s.port}"
    creds = _credentials(s)
    try:
        port = server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
    except RuntimeError:  # grpc's "Failed to bind to address"
        port = 0
    if port == 0:
        raise ConfigError(
            f"cannot bind {address}: the port is in use or the address is not this machine's; "
            "choose another with --port / server.port (0 picks a free one) or --host / server.host"
        )
    logger.info("gRPC server bound to %s:%d (tls=%s, auth=%s)", s.host, port, creds is not None,
                s.auth_token is not None)
    return RewardGrpcServer(server, health, service, s), port
