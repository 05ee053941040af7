"""The exception taxonomy. :mod:`reward_server.rpc.status` holds the one table mapping them to
gRPC status codes; nothing else maps exceptions to codes.

Engine failures come in two kinds, and :func:`engine_failure` tells them apart for the engines
and the hosting layer: an infrastructure failure (the engine is unreachable, its replica died,
it ran out of memory) is :class:`BackendUnavailable` and worth retrying elsewhere or later; a bug
or an answer that makes no sense (an ``IndexError``, the wrong number of results, a probability
outside [0, 1]) is :class:`EngineError`, answered INTERNAL once and never retried.
"""

from __future__ import annotations

QUOTE_CHARS = 64  # longest excerpt of a caller's value an error message quotes


class RewardServerError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(RewardServerError):
    """The configuration is invalid. Message names the field and the fix."""


class InvalidRequest(RewardServerError):
    """The request is malformed (not the policy's fault). Message names item and field."""


class Unauthenticated(RewardServerError):
    """Missing or wrong bearer token."""


class Overloaded(RewardServerError):
    """Too much work queued; retry later with backoff (after ``retry_after_s`` when given)."""

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class BackendUnavailable(RewardServerError):
    """A judge or NLI engine could not answer (crashed, unreachable, out of memory, timed out)."""


class EngineError(RewardServerError):
    """An engine raised an unexpected exception or answered nonsense: a bug, not retried."""


class DeadlineExceeded(RewardServerError):
    """The caller's deadline passed before the work finished."""


class ClientGone(RewardServerError):
    """The client closed its connection before its request arrived: nobody is left to answer."""


class ModelLoadError(RewardServerError):
    """A model could not be loaded or is unusable (e.g. NLI labels without names)."""


def quote(value: str, limit: int = QUOTE_CHARS) -> str:
    """``value`` for an error message: repr of at most ``limit`` characters, with its length."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


# Third-party exception classes that mean "out of memory" or "device gone", by qualified name
# (the engines' libraries are not imported here).
_INFRASTRUCTURE_NAMES = frozenset({
    "torch.OutOfMemoryError",
    "torch.cuda.OutOfMemoryError",
    "torch.AcceleratorError",
    "ray.exceptions.OutOfMemoryError",
    "ray.exceptions.WorkerCrashedError",
    "ray.exceptions.NodeDiedError",
    "ray.exceptions.ObjectLostError",
    "ray.exceptions.OwnerDiedError",
    "ray.exceptions.LocalRayletDiedError",
    "ray.exceptions.RaySystemError",
    "vllm.v1.engine.exceptions.EngineDeadError",
    "vllm.v1.engine.exceptions.EngineGenerateError",
})
_DEVICE_MARKERS = ("CUDA error", "CUDA out of memory", "out of memory", "NCCL error",
                   "device-side assert")


def is_infrastructure_failure(exc: BaseException) -> bool:
    """Whether ``exc`` means the engine's resources failed (memory, device, process,
    connection) rather than its code: those are worth retrying on another replica or later."""
    if isinstance(exc, BackendUnavailable | ModelLoadError | MemoryError | ConnectionError):
        return True
    for cls in type(exc).__mro__:
        if f"{cls.__module__}.{cls.__qualname__}" in _INFRASTRUCTURE_NAMES:
            return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in _DEVICE_MARKERS)


def engine_failure(exc: BaseException, what: str) -> RewardServerError:
    """``exc``, raised by ``what`` (e.g. "judge smollm2 on 256 prompts"), as our taxonomy:
    our own errors as they are, infrastructure as BackendUnavailable, anything else EngineError.
    Raise it ``from exc`` so the server log keeps the original traceback."""
    if isinstance(exc, RewardServerError):
        return exc
    text = f"{what} failed: {type(exc).__name__}: {exc}"
    new: RewardServerError
    if is_infrastructure_failure(exc):
        new = BackendUnavailable(text)
    else:
        new = EngineError(f"{text} (an engine bug or unexpected output; see the server log)")
    new.__cause__ = exc
    return new
