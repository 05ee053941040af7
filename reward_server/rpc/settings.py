"""Settings of the gRPC transport: bind, message sizes, auth, TLS, timeouts, drain, metrics."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ServerSettings(_Frozen):
    """The gRPC ingress."""

    host: str = Field("127.0.0.1", description="Address to bind; 0.0.0.0 for all interfaces.")
    port: int = Field(50051, ge=0, le=65535, description="Port to bind; 0 picks a free one.")
    max_message_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, description="Largest gRPC message received or sent."
    )
    max_concurrent_rpcs: int | None = Field(
        None, ge=1, description="Calls served at once; more are refused (RESOURCE_EXHAUSTED)."
    )
    default_timeout_s: float = Field(
        300.0, gt=0.0, description="Server-side timeout for calls that arrive without a deadline."
    )
    grace_period_s: float = Field(
        30.0, ge=0.0, description="On SIGTERM: how long in-flight calls may finish."
    )
    drain_delay_s: float = Field(
        2.0,
        ge=0.0,
        description="On SIGTERM: health is NOT_SERVING but calls are still accepted this long, "
        "so load balancers route away before the port closes.",
    )
    auth_token: SecretStr | None = Field(
        None,
        description="Bearer token clients must send; also read from $REWARD_SERVER_TOKEN. None: no auth.",
    )
    tls_cert_file: Path | None = Field(None, description="PEM certificate chain; enables TLS.")
    tls_key_file: Path | None = Field(None, description="PEM private key for tls_cert_file.")
    reflection: bool = Field(True, description="Serve gRPC server reflection (grpcurl).")
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="Serve Prometheus /metrics on this port; None: off."
    )
