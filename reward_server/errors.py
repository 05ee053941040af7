"""The exception taxonomy. :mod:`reward_server.rpc.status` holds the one table mapping them to
gRPC status codes; nothing else maps exceptions to codes."""

from __future__ import annotations


class RewardServerError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(RewardServerError):
    """The configuration is invalid. Message names the field and the fix."""


class InvalidRequest(RewardServerError):
    """The request is malformed (not the policy's fault). Message names item and field."""


class Unauthenticated(RewardServerError):
    """Missing or wrong bearer token."""


class Overloaded(RewardServerError):
    """Too much work queued; retry later with backoff."""


class BackendUnavailable(RewardServerError):
    """A judge or NLI engine could not answer (crashed, unreachable, timed out)."""


class DeadlineExceeded(RewardServerError):
    """The caller's deadline passed before the work finished."""


class ModelLoadError(RewardServerError):
    """A model could not be loaded or is unusable (e.g. NLI labels without names)."""
