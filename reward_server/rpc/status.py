"""THE table mapping exceptions to gRPC status codes. Nothing else maps errors to codes."""

from __future__ import annotations

import asyncio

import grpc

from reward_server import errors

STATUS_TABLE: dict[type[BaseException], grpc.StatusCode] = {
    errors.InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    errors.ConfigError: grpc.StatusCode.FAILED_PRECONDITION,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.Overloaded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.BackendUnavailable: grpc.StatusCode.UNAVAILABLE,
    errors.ModelLoadError: grpc.StatusCode.UNAVAILABLE,
    errors.DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    asyncio.TimeoutError: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def status_for(exc: BaseException) -> grpc.StatusCode:
    """The code for ``exc``: its nearest class in the table, else INTERNAL."""
    for cls in type(exc).__mro__:
        code = STATUS_TABLE.get(cls)
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


def message_for(exc: BaseException) -> str:
    code = status_for(exc)
    text = str(exc) or type(exc).__name__
    if code is grpc.StatusCode.INTERNAL:
        return f"internal error ({type(exc).__name__}: {text}); see the server log"
    if code is grpc.StatusCode.DEADLINE_EXCEEDED and not str(exc):
        return "the call's deadline passed before scoring finished; raise the client timeout"
    return text
