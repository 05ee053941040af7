"""Python client for reward.v1 (needs only grpcio, protobuf and pydantic).

    from reward_server.client import AsyncRewardClient, RewardClient, RetryBudget

:mod:`reward_server.client.client` holds the asyncio client and :class:`RewardCallError`,
:mod:`reward_server.client.sync` the synchronous ``RewardClient`` over it;
:mod:`reward_server.client.channel` the channel policy (retry budget, service config, targets);
:mod:`reward_server.client.coalesce` the merging of concurrent small calls (opt-in);
:mod:`reward_server.client.auth` the bearer token from ``$REWARD_SERVER_TOKEN_FILE``.
"""

from __future__ import annotations

from reward_server.client.auth import TOKEN_ENV, TOKEN_FILE_ENV, TokenFileError, bearer_token
from reward_server.client.client import (
    GRPC_MAX_ATTEMPTS,
    HEALTH,
    MIN_BACKOFF_S,
    RETRYABLE,
    SERVICE,
    STUCK_GRACE_S,
    AsyncRewardClient,
    CoalesceSettings,
    RetryBudget,
    RewardCallError,
    Target,
    backoff_delays,
    channel_target,
)
from reward_server.client.sync import RewardClient

__all__ = [
    "GRPC_MAX_ATTEMPTS", "HEALTH", "MIN_BACKOFF_S", "RETRYABLE", "SERVICE", "STUCK_GRACE_S",
    "TOKEN_ENV", "TOKEN_FILE_ENV", "AsyncRewardClient", "CoalesceSettings", "RetryBudget",
    "RewardCallError", "RewardClient", "Target", "TokenFileError", "backoff_delays",
    "bearer_token", "channel_target",
]
