"""Bearer-token authentication (constant-time compare): :class:`TokenCheck`, used by the gRPC
interceptor below and by the HTTP/JSON door.

It runs when a call's headers arrive, before its request message: a refused call is answered
UNAUTHENTICATED at once, without waiting for (or reading) a body, so unauthenticated calls hold
nothing, half-open ones included.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

if TYPE_CHECKING:
    _Interceptor = grpc.aio.ServerInterceptor[Any, Any]
else:  # the runtime class is not generic
    _Interceptor = grpc.aio.ServerInterceptor

# Probes and tooling stay reachable without a token.
OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


class TokenCheck:
    """Whether an ``authorization`` value carries the token: ``Bearer <token>``, or (HTTP
    only, for clients such as OpenRLHF's that can put credentials only in the URL,
    ``http://user:<token>@host``) ``Basic`` with the token as the password."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("auth token must not be empty")
        self._token = token.encode()
        self._expected = b"Bearer " + self._token

    def problem(self, presented: bytes, *, basic: bool = False) -> str | None:
        """None when ``presented`` carries the token; else what is wrong with it."""
        if not presented:
            return "missing authorization metadata; send 'authorization: Bearer <token>'"
        if basic and presented[:6].lower() == b"basic ":
            try:
                _, _, password = base64.b64decode(presented[6:].strip(), validate=True).partition(b":")
            except (binascii.Error, ValueError):
                password = b""
            if hmac.compare_digest(password, self._token):
                return None
        elif hmac.compare_digest(presented, self._expected):
            return None
        return "wrong bearer token"


class BearerTokenInterceptor(_Interceptor):
    """Rejects calls whose ``authorization`` metadata is not ``Bearer <token>``."""

    def __init__(self, token: str) -> None:
        self._check = TokenCheck(token)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        method = handler_call_details.method or ""
        if method.startswith(OPEN_METHOD_PREFIXES):
            return await continuation(handler_call_details)
        presented = b""
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                presented = value.encode() if isinstance(value, str) else bytes(value)
        reason = self._check.problem(presented)
        if reason is None:
            return await continuation(handler_call_details)

        async def deny(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)

        # request-streaming: gRPC starts it on the headers, without waiting for a message
        return grpc.stream_unary_rpc_method_handler(deny)
