"""Settings of the transports: the gRPC ingress (bind, message sizes, auth, TLS, timeouts,
connection bounds, live health, drain, metrics), its optional HTTP/JSON door and tracing."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from reward_server.rpc.jsonlimits import MAX_DEPTH, MAX_VALUES


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


OPENRLHF_END_MARKERS = (
    "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "<eos>",
    "</s>",
)


def unbracket(host: str | None) -> str | None:
    """``[::1]`` -> ``::1``: an IPv6 address is kept bare and bracketed where a port follows."""
    if host is not None and host.startswith("[") and host.endswith("]"):
        return host[1:-1]
    return host


def host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets (``[::1]:50051``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class HttpSettings(_Frozen):
    """The HTTP/JSON door: the same service, auth, limits and error table as gRPC, on its own
    port (docs/http.md)."""

    port: int | None = Field(
        None, ge=0, le=65535, description="Serve HTTP/JSON (POST /v1/score, ..., the OpenRLHF "
        "reward route) on this port; 0 picks a free one. None: off."
    )
    host: str | None = Field(None, description="Address to bind; None: server.host.")
    max_body_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, description="Largest JSON request body read; a larger one "
        "is refused (400) before it is read. The request it encodes must still fit "
        "server.max_message_bytes and service.limits; twice that size leaves room for JSON's "
        "field names, quotes and escapes."
    )
    max_json_depth: int = Field(
        MAX_DEPTH, ge=2, description="Deepest nesting of a JSON body (and of an OpenRLHF "
        "label); deeper is refused (400) before it is parsed."
    )
    max_json_values: int = Field(
        MAX_VALUES, ge=16, description="Most JSON values (objects, arrays, members, elements) "
        "a body may hold; more is refused (400) before any is built."
    )
    header_timeout_s: float = Field(
        10.0, gt=0.0, description="A connection must send a request's headers this long after "
        "it opened or its last answer; otherwise it is closed (idle connections hold no slot)."
    )
    max_connections: int = Field(
        4096, ge=1, description="Open HTTP connections; past it a request gets 503, except "
        "GET /v1/health, which has HEALTH_RESERVE more connections of its own (and answers "
        "NOT_SERVING meanwhile)."
    )
    max_connections_per_peer: int | None = Field(
        1024, ge=1, description="Open HTTP connections of one address; past it a new one is "
        "closed at once, so that one peer cannot take every slot (a client with more requests "
        "at once should reuse its connections). None: no share."
    )
    _host = field_validator("host")(unbracket)
    openrlhf_end_markers: tuple[str, ...] = Field(
        OPENRLHF_END_MARKERS, description="OpenRLHF route: special-token texts removed from the "
        "end of a response (OpenRLHF decodes with skip_special_tokens=False, so the EOS token's "
        "text ends the query)."
    )


class TracingSettings(_Frozen):
    """OpenTelemetry spans for every call and the engine batches it makes."""

    enabled: bool = Field(
        False, description="Record spans (reward.v1/<Method> per call, engine.<name> per engine "
        "batch) through the global tracer provider; a no-op without the opentelemetry package."
    )
    otlp_endpoint: str | None = Field(
        None, description="Export spans over OTLP/HTTP to this URL (needs opentelemetry-sdk and "
        "opentelemetry-exporter-otlp-proto-http); None: use whatever provider the process set up."
    )


class ServerSettings(_Frozen):
    """The gRPC ingress."""

    host: str = Field("127.0.0.1", description="Address to bind; 0.0.0.0 for all interfaces, "
                      "::1 (or [::1]) for IPv6 loopback.")
    _host = field_validator("host")(unbracket)
    port: int = Field(50051, ge=0, le=65535, description="Port to bind; 0 picks a free one.")
    reuse_port: bool = Field(
        False, description="Bind the gRPC port, the health port and the HTTP door with "
        "SO_REUSEPORT, so that several server processes on this machine share them (several "
        "ingresses attached to the same Ray applications, docs/operations.md); the kernel "
        "spreads connections, not calls, over them. False: a port in use fails the start."
    )
    max_message_bytes: int = Field(
        32 * 1024 * 1024, ge=1024, description="Largest gRPC message received or sent; a "
        "larger one is refused by gRPC (RESOURCE_EXHAUSTED) before the server reads it. gRPC "
        "Python copies a received message into Python bytes in one step that holds the "
        "interpreter lock (health checks wait meanwhile: ~2-2.5 ms per MB on a 2-core host), so "
        "this also bounds that pause; 1,024 items of 30 KB each still fit."
    )
    compressed_requests: bool = Field(
        False, description="Take gzip/deflate-compressed gRPC requests (grpc-encoding). False: "
        "they are refused (UNIMPLEMENTED, 'Compression algorithm ... is disabled') before "
        "gRPC inflates them, and gRPC core logs a line each: a 64 KB gzip bomb inflates to the "
        "max_message_bytes cap in ~30 ms of gRPC's CPU, and 128 at once held health 0.7-0.9 s "
        "and a good call 9-11 s (bench/faults.py). Responses are never compressed."
    )
    max_concurrent_rpcs: int | None = Field(
        None, ge=1, description="gRPC's own cap on calls handled at once (health checks "
        "included; more are RESOURCE_EXHAUSTED). It counts a call before authentication, so "
        "leave it off and rely on service.admission (work in flight, after authentication)."
    )
    receive_timeout_s: float = Field(
        30.0, gt=0.0, description="A call whose request message has not fully arrived this long "
        "after its headers is ended (DEADLINE_EXCEEDED): half-open calls hold nothing for long."
    )
    handshake_timeout_s: float = Field(
        10.0, gt=0.0, description="A connection that has not finished its TLS/HTTP/2 preface "
        "this long after connecting is closed (grpc.server_handshake_timeout_ms)."
    )
    max_concurrent_streams: int = Field(
        128, ge=1, description="Calls one HTTP/2 connection may have open at once; a client "
        "queues the rest (grpc.max_concurrent_streams)."
    )
    max_pending_calls: int = Field(
        4096, ge=1, description="Calls gRPC core holds before the server takes them: the "
        "server takes one call at a time, so a burst waits there first. Past it gRPC core "
        "ends new calls CANCELLED, which clients do not retry (its own default: at random past "
        "1,000, all past 3,000). Each waiting call holds about 15-30 KB "
        "(grpc.server.max_pending_requests and _hard_limit, both set to this)."
    )
    max_connections: int | None = Field(
        8192, ge=1, description="Connections accepted at once; more are closed at once "
        "(grpc.max_allowed_incoming_connections). Connections that make no call are closed "
        "after max_connection_idle_s, so a peer must open more than this many within that "
        "time to lock anyone out; the process's open-file limit is raised to fit. None: "
        "unlimited."
    )
    max_connections_per_peer: int | None = Field(
        1024, ge=1, description="Connections one address may hold open on the gRPC port, so "
        "that one peer cannot take max_connections and lock the others out: while it holds "
        "this many, its new connections are dropped by the kernel before gRPC accepts them (a "
        "socket filter; the peer's kernel retries them after 1, 3, 7 ... s), and past it its "
        "most idle ones are closed (looked at every connection_check_s, and sooner when many "
        "connections open at once). gRPC's own cap is max_connections plus this, so that a "
        "peer opening connections faster than they are looked at does not lock the others "
        "out meanwhile. Clients behind one address (a NAT, a proxy) share it. None: no share. "
        "Linux only (reward_server/rpc/connections.py, synfilter.py)."
    )
    connection_check_s: float = Field(
        0.5, gt=0.0, le=60.0, description="How often the gRPC port's connections are looked at "
        "(in a worker thread; sooner when the process's open descriptors grow by an eighth of "
        "max_connections_per_peer, Linux 6.2 and later): shares per peer, connections that "
        "reset calls before sending them (rapid reset), keep many calls waiting for their request, or send bytes that "
        "never become requests (a CONTINUATION flood) are closed; health is NOT_SERVING while "
        "max_connections are open."
    )
    max_unsent_response_bytes: int = Field(
        256 * 1024 * 1024, ge=1024, description="Response bytes held for peers that have not "
        "read them yet, all connections together; a response past it is dropped and its call "
        "answered RESOURCE_EXHAUSTED (see reward_server/rpc/unsent.py)."
    )
    max_unsent_response_bytes_per_connection: int = Field(
        32 * 1024 * 1024, ge=1024, description="The same for one connection; past it that "
        "connection's calls in flight are cancelled and new ones refused until it reads."
    )
    keepalive_time_s: float = Field(
        60.0, gt=0.0, description="Ping each connection after this long without activity "
        "(grpc.keepalive_time_ms), so dead or non-reading peers are found ..."
    )
    keepalive_timeout_s: float = Field(
        20.0, gt=0.0, description="... and close it when the ping is not answered this long "
        "(grpc.keepalive_timeout_ms)."
    )
    min_client_ping_interval_s: float = Field(
        10.0, gt=0.0, description="Clients may send keepalive pings this often without calls "
        "(grpc.http2.min_ping_interval_without_data_ms); more often is answered with GOAWAY."
    )
    malloc_mmap_threshold_bytes: int | None = Field(
        128 * 1024, ge=4096, le=32 * 1024 * 1024, description="glibc only: allocations this "
        "large or larger that no free block of the heap can hold get their own memory "
        "mapping, returned to the system when freed (mallopt M_MMAP_THRESHOLD; process-wide). "
        "glibc's own default starts at the same 128 KiB but rises after each large block "
        "freed, up to 32 MiB, and then large messages' "
        "buffers stay resident after their calls (bench/faults.py --only memory, three runs: "
        "RSS after the 52 MB messages gRPC refuses +1 to +50 % with glibc's default, -1 to +2 % "
        "with 128 KiB). None: glibc's adjusting default."
    )
    malloc_tcache_count: int | None = Field(
        0, ge=0, le=65535, description="glibc only, process-wide, `reward-server serve` only: "
        "freed chunks of each size that each thread keeps for itself (GLIBC_TUNABLES "
        "glibc.malloc.tcache_count; glibc's default is 7). A trim cannot return those "
        "chunks, so after a flood the ones gRPC's threads keep pin pages that are otherwise "
        "free (rapid reset on a fresh server, RSS after: +5.0 to +11.1 % with 0, +13.6 to "
        "+16.3 % with 7). glibc reads it only at start, so `serve` starts itself again with it once, "
        "unless GLIBC_TUNABLES names it already (then that value is used). None: glibc's "
        "default, no restart."
    )
    max_connection_idle_s: float | None = Field(
        120.0, gt=0.0, description="Close a connection with no call in flight for this long, "
        "including one that never made a call (grpc.max_connection_idle_ms, with GOAWAY: gRPC "
        "clients reconnect on their next call, transparently). Not shorter by default: grpc "
        "1.85 clients log a 'Got goaway ... connection idle' line at INFO on each such close, "
        "and a trainer's channel idles for a whole step between reward calls. None: never."
    )
    max_connection_age_s: float | None = Field(
        None, gt=0.0, description="Send GOAWAY to a connection this old, then give its calls "
        "grace_period_s (grpc.max_connection_age_ms; spreads long-lived clients over replicas "
        "behind an L4 balancer). None: never."
    )
    health_poll_s: float = Field(
        1.0, gt=0.0, description="How often grpc.health.v1 asks the engines (Engines.health); "
        "an engine failure triggers an immediate check."
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
        "so load balancers route away; then new calls get UNAVAILABLE, accepted ones get "
        "grace_period_s to finish, and the port closes.",
    )
    auth_token: SecretStr | None = Field(
        None,
        description="Bearer token clients must send; also read from $REWARD_SERVER_TOKEN or, unset, "
        "the file $REWARD_SERVER_TOKEN_FILE (what the deploy manifests use). None: no auth.",
    )
    tls_cert_file: Path | None = Field(None, description="PEM certificate chain; enables TLS.")
    tls_key_file: Path | None = Field(None, description="PEM private key for tls_cert_file.")
    reflection: bool = Field(True, description="Serve gRPC server reflection (grpcurl).")
    metrics_port: int | None = Field(
        0, ge=0, le=65535, description="Serve Prometheus GET /metrics (docs/metrics.md) on this "
        "port of server.host; 0 picks a free one (logged at start). None: no metrics port (the "
        "HTTP door, when on, still serves GET /metrics)."
    )
    health_port: int | Literal["auto"] | None = Field(
        "auto", description="Also serve grpc.health.v1 alone on this port (on host, with TLS "
        "as the main port), with its own connection cap (64) and a 10 s idle close, so that no "
        "flood of connections on the main port locks health checks out; 0 picks a free one. "
        "auto: the main port + 1 (a free one when the main port is 0), and when that port is "
        "taken the server starts without it (logged). None: off."
    )
    http: HttpSettings = Field(default_factory=HttpSettings, description="The HTTP/JSON door.")
    tracing: TracingSettings = Field(
        default_factory=TracingSettings, description="OpenTelemetry spans."
    )
