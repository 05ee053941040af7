"""The HTTP/JSON door: the reward.v1 methods as JSON over HTTP/1.1, on ``server.http.port``.

Routes (docs/http.md)::

    POST /v1/score            reward.v1.ScoreRequest         -> ScoreResponse
    POST /v1/induce_rubrics   reward.v1.InduceRubricsRequest -> InduceRubricsResponse
    POST /v1/verify           reward.v1.VerifyRequest        -> VerifyResponse
    GET  /v1/info (or POST)                                  -> InfoResponse
    GET  /v1/health           {"status": "SERVING" | "NOT_SERVING", "down": {engine: why}}
    GET  /metrics             Prometheus text format (docs/metrics.md); open, as health is
    POST /openrlhf/reward     OpenRLHF's remote reward protocol (reward_server.rpc.openrlhf)

Bodies are the proto3 JSON mapping in one convention (:mod:`reward_server.api.jsonmap`). Every
call runs through the gRPC servicer's :meth:`~reward_server.rpc.servicer.RewardServicer.call`:
the same draining gate, admission, limits, deadline (``server.default_timeout_s``), work,
metrics and spans. Errors are the gRPC status table's code mapped to its HTTP status
(:data:`reward_server.rpc.status.HTTP_STATUS`), with the body
``{"error": {"code": <http>, "status": "<gRPC code>", "message": "..."}}`` and, when the server
knows how long to wait, ``Retry-After``. The token of ``server.auth_token`` is required as
``Authorization: Bearer <token>`` (or as the password of HTTP Basic auth, which is what
``http://user:<token>@host`` URLs send); ``/v1/health`` is open, as gRPC health is.

Starlette routes it and uvicorn serves it, as a task of the server's own event loop, with
uvicorn's signal handling off (the CLI's SIGTERM/SIGINT drain stops both doors); its
connections (httptools' parser, the door's bounds) are :mod:`reward_server.rpc.http_conn`'s.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import math
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import uvicorn
from google.protobuf.message import Message
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from reward_server import metrics
from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server.api import jsonmap
from reward_server.errors import (
    ClientGone,
    ConfigError,
    DeadlineExceeded,
    InvalidRequest,
    Unauthenticated,
)
from reward_server.rpc import jsonlimits, openrlhf
from reward_server.rpc.auth import TokenCheck
from reward_server.rpc.health import HealthMonitor
from reward_server.rpc.http_conn import HEAD_AT, DoorProtocol
from reward_server.rpc.servicer import RewardServicer
from reward_server.rpc.settings import ServerSettings
from reward_server.rpc.status import http_headers_for, http_status_for, message_for, status_for

logger = logging.getLogger(__name__)
JSON = "application/json"
PARSE_INLINE_BYTES = 256 * 1024  # larger bodies are parsed in a worker thread
METHODS: dict[str, tuple[str, type[Message]]] = {  # path -> (method, request message)
    "/v1/score": ("Score", pb.ScoreRequest),
    "/v1/induce_rubrics": ("InduceRubrics", pb.InduceRubricsRequest),
    "/v1/verify": ("Verify", pb.VerifyRequest),
}


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """JSON text (NaN written as ``NaN``, as Python's json reads it)."""
    return Response(json.dumps(body, ensure_ascii=False), status, headers, media_type=JSON)


def not_json(request: Request) -> Response | None:
    """415 for a body declared as anything but JSON (form, multipart and text/plain bodies are
    what a browser may POST cross-site without asking); None when it is JSON or undeclared."""
    declared = request.headers.get("content-type")
    if declared is None:
        return None
    media = declared.split(";", 1)[0].strip().lower()
    if media == JSON or (media.startswith("application/") and media.endswith("+json")):
        return None
    message = (f"the body is declared {media or 'empty'!r}; send JSON with "
               "Content-Type: application/json")
    return json_response({"error": {"code": 415, "status": "INVALID_ARGUMENT",
                                    "message": message}}, 415)


class BodyTimeout(DeadlineExceeded):
    """The request's body did not arrive in time: its connection is closed with the answer (the
    rest of the body is not waited for)."""


def error_response(exc: BaseException) -> Response:
    status = http_status_for(exc)
    body = {"error": {"code": status, "status": status_for(exc).name, "message": message_for(exc)}}
    headers = http_headers_for(exc)
    if isinstance(exc, BodyTimeout):
        headers["Connection"] = "close"
    return json_response(body, status, headers)


async def no_route(request: Request, exc: Exception) -> Response:
    """404 (no such path) and 405 (not that method) in the door's JSON error envelope, with the
    routes there are; gRPC's status as grpc-gateway answers them (NOT_FOUND, UNIMPLEMENTED)."""
    status = getattr(exc, "status_code", 404)
    headers = dict(getattr(exc, "headers", None) or {})
    path = request.url.path
    if status == 405:
        allowed = headers.get("allow") or headers.get("Allow") or "another method"
        message = f"{request.method} {path} is not allowed; use {allowed}"
        code = "UNIMPLEMENTED"
    else:
        routes = [f"{'/'.join(sorted(r.methods - {'HEAD'}))} {r.path}"
                  for r in request.app.routes if isinstance(r, Route) and r.methods]
        message = f"no route {path}; the routes are {', '.join(routes)}"
        code = "NOT_FOUND"
    return json_response({"error": {"code": status, "status": code, "message": message}},
                         status, headers)


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the reward server drains on SIGTERM itself."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpDoor:
    """The HTTP/JSON door over ``servicer`` (see the module doc); bound at construction."""

    def __init__(
        self, settings: ServerSettings, servicer: RewardServicer, monitor: HealthMonitor
    ) -> None:
        self._settings = settings
        self._servicer = servicer
        self._monitor = monitor
        token = settings.auth_token
        self._check = TokenCheck(token.get_secret_value()) if token is not None else None
        routes = [Route(path, self._endpoint(rpc, cls), methods=["POST"])
                  for path, (rpc, cls) in METHODS.items()]
        routes += [
            Route("/v1/info", self._info, methods=["GET", "POST"]),
            Route("/v1/health", self._health, methods=["GET"]),
            Route("/openrlhf/reward", self._openrlhf, methods=["POST"]),
            Route("/metrics", self._metrics, methods=["GET"]),
        ]
        self.routes = Starlette(routes=routes)
        http = settings.http
        self.host = http.host or settings.host
        self._socket = self._bind(self.host, http.port or 0, reuse_port=settings.reuse_port)
        self.port: int = self._socket.getsockname()[1]
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        for status in (404, 405):  # in the JSON error envelope, like every other error
            self.routes.add_exception_handler(status, no_route)

    @staticmethod
    def _bind(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            sock.close()
            raise ConfigError(
                f"cannot bind the HTTP door to {host}:{port} ({e.strerror}); choose another "
                "server.http.port (0 picks a free one) or server.http.host"
            ) from None
        sock.set_inheritable(True)
        return sock

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The routes, behind the connection cap: past server.http.max_connections open
        connections only GET /v1/health is answered (503 for the rest)."""
        limit = self._settings.http.max_connections
        if (scope["type"] == "http" and scope["path"] != "/v1/health" and self._server is not None
                and len(self._server.server_state.connections) > limit):
            body = {"error": {"code": 503, "status": "UNAVAILABLE", "message": (
                f"more than server.http.max_connections={limit} connections are open; retry "
                "shortly")}}
            await json_response(body, 503, {"Retry-After": "1"})(scope, receive, send)
            return
        await self.routes(scope, receive, send)

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        http = self._settings.http
        protocol = type("Protocol", (DoorProtocol,), {
            "header_timeout_s": http.header_timeout_s, "max_connections": http.max_connections,
            "per_peer": http.max_connections_per_peer, "peers": collections.Counter(),
            "body_timeout_s": self._settings.receive_timeout_s})
        config = uvicorn.Config(
            self.app, log_config=None, access_log=False, lifespan="off",
            timeout_graceful_shutdown=max(1, math.ceil(self._settings.grace_period_s)),
            http=protocol, interface="asgi3", server_header=False,
        )
        self._server = _Server(config)
        self._task = asyncio.get_running_loop().create_task(
            self._server.serve(sockets=[self._socket]), name="http-door"
        )
        while not self._server.started:
            if self._task.done():  # failed to start: raise its error here
                self._task.result()
                raise ConfigError("the HTTP door stopped while starting")
            await asyncio.sleep(0.01)
        logger.info("HTTP/JSON door on http://%s:%d (auth=%s)", self.host, self.port,
                    self._check is not None)

    async def stop(self) -> None:
        """Stop accepting connections, let requests in flight finish, close."""
        if self._server is None or self._task is None:
            self._socket.close()
            return
        self._server.should_exit = True
        try:
            await self._task
        finally:
            self._socket.close()
            self._server = self._task = None
        logger.info("HTTP/JSON door stopped")

    # ---------------------------------------------------------------- calls
    def _authorize(self, request: Request, rpc: str) -> None:
        if self._check is None:
            return
        problem = self._check.problem(request.headers.get("authorization", "").encode(),
                                      basic=True)
        if problem is not None:  # refused before the call: counted here (a 401)
            metrics.observe_call(rpc, "UNAUTHENTICATED", 0.0, transport="http")
            raise Unauthenticated(problem.replace("metadata", "header"))

    async def _body(self, request: Request) -> bytearray:
        limit = self._settings.http.max_body_bytes
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise InvalidRequest(f"the body has {length} bytes, more than "
                                 f"server.http.max_body_bytes={limit}")

        async def read() -> bytearray:
            # one growing buffer (realloc moves no bytes once it is large) rather than a join
            # at the end: one 64 MiB copy held the event loop ~50 ms
            body = bytearray()
            async for chunk in request.stream():
                if len(body) + len(chunk) > limit:
                    raise InvalidRequest(f"the body is larger than server.http.max_body_bytes="
                                         f"{limit}")
                body += chunk
            return body

        timeout = self._settings.receive_timeout_s
        try:
            # counted from the request's head, which DoorProtocol stamps on every request
            # (asyncio.timeout_at: no task, as wait_for's in 3.11)
            async with asyncio.timeout_at(request.scope["state"][HEAD_AT] + timeout):
                return await read()
        except TimeoutError:
            raise BodyTimeout(f"the request body did not arrive within "
                              f"server.receive_timeout_s={timeout}s") from None
        except ClientDisconnect:  # CANCELLED, as a gRPC call its client reset: no traceback
            # (1,024 slow bodies dropped at once logged 1,024 of them as unexpected errors)
            raise ClientGone("the client closed the connection before its request body "
                             "arrived") from None

    async def _call(self, request: Request, rpc: str,
                    receive: Callable[[], Awaitable[bytes]]) -> Message:
        self._authorize(request, rpc)
        reply = await self._servicer.call(rpc, receive, time_remaining=lambda: None,
                                          transport="http")
        return self._servicer.as_message(rpc, reply)

    def _parse(self, cls: type[Message], body: bytes | bytearray) -> bytes:
        http = self._settings.http
        return serialized(jsonlimits.parse_message(cls, body, max_depth=http.max_json_depth,
                                                   max_values=http.max_json_values))

    def _endpoint(self, rpc: str, cls: type[Message]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            if (refused := not_json(request)) is not None:
                return refused

            async def receive() -> bytes:
                body = await self._body(request) or b"{}"
                self._servicer.trimmer.freed(len(body))  # let go when the call ends
                if len(body) < PARSE_INLINE_BYTES:
                    return self._parse(cls, body)
                # json_format walks the JSON in Python: keep the event loop free meanwhile
                return await asyncio.to_thread(self._parse, cls, body)

            try:
                return json_response(jsonmap.to_dict(await self._call(request, rpc, receive)))
            except Exception as exc:  # the one table; INTERNAL for anything unexpected
                return error_response(exc)

        return endpoint

    async def _info(self, request: Request) -> Response:
        async def receive() -> bytes:
            return b""

        try:
            return json_response(jsonmap.to_dict(await self._call(request, "Info", receive)))
        except Exception as exc:
            return error_response(exc)

    async def _health(self, request: Request) -> Response:
        down = dict(self._monitor.down)
        limit = self._settings.http.max_connections
        if self._server is not None and len(self._server.server_state.connections) > limit:
            down["http"] = (f"more than server.http.max_connections={limit} connections are "
                            "open: new ones are refused (but for health)")
        serving = bool(self._monitor.serving) and not down
        body = {"status": "SERVING" if serving else "NOT_SERVING", "down": down}
        return json_response(body, 200 if serving else 503)

    async def _metrics(self, request: Request) -> Response:
        body, content_type = await asyncio.to_thread(metrics.exposition)  # off the event loop
        return Response(body, 200, media_type=content_type)

    async def _openrlhf(self, request: Request) -> Response:
        if (refused := not_json(request)) is not None:
            return refused
        markers = self._settings.http.openrlhf_end_markers
        built: list[pb.ScoreRequest] = []
        try:
            self._authorize(request, "Score")
            body = await self._body(request)  # small: OpenRLHF sends one sample per request
            if _empty_batch(body):  # what OpenRLHF sends its 2nd, 3rd, ... server
                return json_response({"rewards": [], "scores": [], "extra_logs": {}})

            def build() -> bytes:
                http = self._settings.http
                payload = jsonlimits.loads(body, max_depth=http.max_json_depth,
                                           max_values=http.max_json_values, what="the body")
                built.append(openrlhf.score_request(payload, end_markers=markers))
                return serialized(built[-1])

            async def receive() -> bytes:
                return build() if len(body) < PARSE_INLINE_BYTES else await asyncio.to_thread(build)

            response = await self._call(request, "Score", receive)
            assert isinstance(response, pb.ScoreResponse)
            return json_response(openrlhf.reply(built[-1], response))
        except Exception as exc:
            return error_response(exc)


def serialized(message: Message) -> bytes:
    """``message.SerializeToString()``; a ScoreRequest one item at a time (its wire format is
    the items' records in a row), since one call over a 60 MB request held the interpreter lock,
    and with it the event loop and health checks, for 120+ ms."""
    if not isinstance(message, pb.ScoreRequest):
        return message.SerializeToString()
    parts: list[bytes] = []
    for item in message.items:
        record = item.SerializeToString()
        parts += (b"\n", _varint(len(record)), record)  # field 1, length-delimited
    return b"".join(parts)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _empty_batch(body: bytes | bytearray) -> bool:
    if len(body) > 256:  # an empty batch is a few bytes; anything else takes the bounded path
        return False
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return False
    return isinstance(payload, dict) and payload.get("query") == []
