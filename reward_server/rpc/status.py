"""THE table mapping exceptions to gRPC status codes, and those codes to HTTP statuses for the
HTTP/JSON door. Nothing else maps errors to codes.

Retrying a call helps only for the codes marked retryable: the engine or the server is busy
(RESOURCE_EXHAUSTED, with a ``grpc-retry-pushback-ms`` hint in the trailers when the server
knows how long to wait) or unreachable (UNAVAILABLE). A bug is INTERNAL: asking again gives the
same answer.
"""

from __future__ import annotations

import asyncio
import math

import grpc

from reward_server import errors

STATUS_TABLE: dict[type[BaseException], grpc.StatusCode] = {
    errors.InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    errors.ConfigError: grpc.StatusCode.FAILED_PRECONDITION,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.Overloaded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.BackendUnavailable: grpc.StatusCode.UNAVAILABLE,
    errors.ModelLoadError: grpc.StatusCode.UNAVAILABLE,
    MemoryError: grpc.StatusCode.UNAVAILABLE,
    ConnectionError: grpc.StatusCode.UNAVAILABLE,
    errors.EngineError: grpc.StatusCode.INTERNAL,
    errors.DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.ClientGone: grpc.StatusCode.CANCELLED,
    asyncio.TimeoutError: grpc.StatusCode.DEADLINE_EXCEEDED,
}
# The HTTP status of each code, as Google APIs and grpc-gateway map them (google.rpc.Code).
HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
}
RETRYABLE = frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE})
# gRFC A6: a server's pushback, honoured by gRPC clients with a retryPolicy for the code
RETRY_PUSHBACK_KEY = "grpc-retry-pushback-ms"
MAX_DETAILS_CHARS = 1024  # status details travel in trailers; keep them far below 8 KiB


def status_for(exc: BaseException) -> grpc.StatusCode:
    """The code for ``exc``: its nearest class in the table, else INTERNAL."""
    for cls in type(exc).__mro__:
        code = STATUS_TABLE.get(cls)
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


def _clip(text: str) -> str:
    if len(text) <= MAX_DETAILS_CHARS:
        return text
    return f"{text[: MAX_DETAILS_CHARS - 40]}... ({len(text)} characters in all)"


def message_for(exc: BaseException) -> str:
    """The status details for ``exc``: its message, at most MAX_DETAILS_CHARS characters."""
    code = status_for(exc)
    text = str(exc) or type(exc).__name__
    if code is grpc.StatusCode.INTERNAL and not isinstance(exc, errors.EngineError):
        text = f"internal error ({type(exc).__name__}: {text}); see the server log"
    elif code is grpc.StatusCode.DEADLINE_EXCEEDED and not str(exc):
        text = "the call's deadline passed before scoring finished; raise the client timeout"
    return _clip(text)


def trailers_for(exc: BaseException) -> tuple[tuple[str, str], ...]:
    """Trailing metadata for ``exc``: the retry pushback of an Overloaded that names one."""
    if isinstance(exc, errors.Overloaded) and exc.retry_after_s is not None:
        return ((RETRY_PUSHBACK_KEY, str(max(0, round(exc.retry_after_s * 1000)))),)
    return ()


def http_status_for(exc: BaseException) -> int:
    """The HTTP status for ``exc``: the HTTP status of its gRPC code."""
    return HTTP_STATUS[status_for(exc)]


def http_headers_for(exc: BaseException) -> dict[str, str]:
    """HTTP headers for ``exc``: ``Retry-After`` (whole seconds) for an Overloaded that names
    a wait, ``WWW-Authenticate`` for a refused token."""
    if isinstance(exc, errors.Overloaded) and exc.retry_after_s is not None:
        return {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
    if isinstance(exc, errors.Unauthenticated):
        return {"WWW-Authenticate": 'Bearer realm="reward-server"'}
    return {}


# the error each code crosses a process boundary as (a service replica to its ingress,
# :mod:`reward_server.rpc.forwarding`): one of ours, which pickles with its fields
_PORTABLE: dict[grpc.StatusCode, type[errors.RewardServerError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidRequest,
    grpc.StatusCode.FAILED_PRECONDITION: errors.ConfigError,
    grpc.StatusCode.UNAUTHENTICATED: errors.Unauthenticated,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.Overloaded,
    grpc.StatusCode.UNAVAILABLE: errors.BackendUnavailable,
    grpc.StatusCode.INTERNAL: errors.EngineError,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.DeadlineExceeded,
}


def portable(exc: BaseException) -> errors.RewardServerError:
    """``exc`` as one of our errors that maps to the same code, message and trailers here
    (ours as they are): what a service replica raises to the ingress that forwarded the call."""
    if isinstance(exc, errors.RewardServerError):
        return exc
    return _PORTABLE[status_for(exc)](message_for(exc))
