"""Bearer-token authentication as a grpc.aio server interceptor (constant-time compare).

It runs when a call's headers arrive, before its request message: a refused call is answered
UNAUTHENTICATED at once, without waiting for (or reading) a body, so unauthenticated calls hold
nothing, half-open ones included.
"""

from __future__ import annotations

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


class BearerTokenInterceptor(_Interceptor):
    """Rejects calls whose ``authorization`` metadata is not ``Bearer <token>``."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("auth token must not be empty")
        self._expected = f"Bearer {token}".encode()

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
        if hmac.compare_digest(presented, self._expected):
            return await continuation(handler_call_details)
        reason = (
            "missing authorization metadata; send 'authorization: Bearer <token>'"
            if not presented
            else "wrong bearer token"
        )

        async def deny(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)

        # request-streaming: gRPC starts it on the headers, without waiting for a message
        return grpc.stream_unary_rpc_method_handler(deny)
