"""The reward function verl's reward loop calls, and the only module that touches verl.

verl 0.9.1 (``reward.custom_reward_function.path`` = this file, ``name`` = ``compute_score``)
runs one coroutine per finished rollout through its reward manager (``naive``:
``run_single``), calling::

    await compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...,
                        **reward.custom_reward_function.reward_kwargs)

Everything the reward needs is in ``extra_info`` (written by ``trainer.data.prepare``); the
reward kwargs say where the server is. An infrastructure failure never becomes a score: by
default the call raises with the server's status and message; with
``mask_infra_failures=True`` the sample is masked instead (score NaN, ``reward_masked`` = 1,
counted and logged) and the ``grpo_masked`` advantage estimator registered here gives masked
samples zero advantage and leaves them out of their group's mean and std (plain ``grpo``
would turn the whole group NaN: use ``algorithm.adv_estimator=grpo_masked`` with masking).

verl builds each metric array from the first result's keys, so every result carries the same
keys: ``score``, ``policy_invalid``, ``reward_masked`` and the kind's components
(:data:`trainer.tasks.specs.COMPONENT_KEYS`); a component the server did not report is NaN.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

from reward_server.client import AsyncRewardClient, RewardCallError
from reward_server.domain import ItemResult, ItemStatus, ScoreItem
from trainer.tasks.specs import COMPONENT_KEYS, spec_from_extra_info

logger = logging.getLogger(__name__)

ADDRESS_ENV = "REWARD_SERVER_ADDRESS"
TOKEN_ENV = "REWARD_SERVER_TOKEN"
MASKED_ESTIMATOR = "grpo_masked"

_clients: dict[tuple[Any, ...], AsyncRewardClient] = {}
_lock = threading.Lock()
_counts = {"scored": 0, "policy_invalid": 0, "masked": 0}


def counters() -> dict[str, int]:
    """Samples scored, policy-invalid and masked in this process (for logs and tests)."""
    return dict(_counts)


def _client(
    address: str, token: str | None, timeout_s: float, max_retries: int
) -> AsyncRewardClient:
    """One client per (server, event loop): grpc.aio channels belong to the loop they run on."""
    key = (address, token, timeout_s, max_retries, id(asyncio.get_running_loop()))
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = AsyncRewardClient(address, token=token, timeout_s=timeout_s,
                                       max_retries=max_retries)
            _clients[key] = client
        return client


def result_to_dict(kind: str, result: ItemResult) -> dict[str, float]:
    """The fixed-key dict verl logs for one scored sample."""
    assert result.reward is not None, "an OK/POLICY_INVALID result always carries a reward"
    out = {"score": float(result.reward),
           "policy_invalid": 1.0 if result.status is ItemStatus.POLICY_INVALID else 0.0,
           "reward_masked": 0.0}
    for key in COMPONENT_KEYS.get(kind, ()):
        value = result.components.get(key)
        out[key] = float(value) if value is not None else math.nan
    return out


def masked_dict(kind: str) -> dict[str, float]:
    out = {"score": math.nan, "policy_invalid": 0.0, "reward_masked": 1.0}
    out.update({k: math.nan for k in COMPONENT_KEYS.get(kind, ())})
    return out


async def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any = None,
    extra_info: Mapping[str, Any] | None = None,
    *,
    reward_server: str | None = None,
    token_env: str = TOKEN_ENV,
    timeout_s: float = 120.0,
    max_retries: int = 3,
    mask_infra_failures: bool = False,
    **_: Any,
) -> dict[str, float]:
    """Score one rollout on the reward server; see the module doc for the contract."""
    if extra_info is None:
        raise ValueError(f"{data_source}: extra_info is missing; prepare the data with "
                         "`python -m trainer.data.prepare`")
    address = reward_server or os.environ.get(ADDRESS_ENV)
    if not address:
        raise ValueError(f"no reward server address: set reward_kwargs.reward_server=host:port "
                         f"or ${ADDRESS_ENV}")
    kind = str(extra_info.get("kind") or "")
    spec = spec_from_extra_info(extra_info, solution_str)
    item = ScoreItem(item_id=f"{extra_info.get('user_id', '')}#{extra_info.get('index', 0)}",
                     spec=spec)
    client = _client(address, os.environ.get(token_env) or None, timeout_s, max_retries)
    try:
        (result,) = await client.score([item])
    except RewardCallError as e:
        if not mask_infra_failures:
            raise
        _counts["masked"] += 1
        logger.warning("reward masked (%d so far) for %s user %s: %s %s", _counts["masked"],
                       data_source, extra_info.get("user_id"), e.code.name, e.details)
        return masked_dict(kind)
    _counts["scored"] += 1
    if result.status is ItemStatus.POLICY_INVALID:
        _counts["policy_invalid"] += 1
        logger.debug("policy-invalid output for user %s: %s", extra_info.get("user_id"),
                     result.message)
    return result_to_dict(kind, result)


async def close_clients() -> None:
    """Close this event loop's clients (verl never calls it; tests and TRL do)."""
    loop_id = id(asyncio.get_running_loop())
    with _lock:
        mine = [k for k in _clients if k[-1] == loop_id]
        clients = [_clients.pop(k) for k in mine]
    for c in clients:
        await c.close()


def grpo_masked_advantage(
    token_level_rewards: Any,
    response_mask: Any,
    index: Any,
    epsilon: float = 1e-6,
    config: Any = None,
    **_: Any,
) -> tuple[Any, Any]:
    """GRPO outcome advantage where NaN-scored (masked) samples are left out.

    Per group (same ``index``): mean and std over the unmasked scores only (a group with one
    unmasked sample gets mean 0, std 1, as verl's GRPO does for singletons); masked samples
    get advantage 0. NaN rewards are then zeroed in place so verl's score metrics stay finite;
    the masked fraction is the mean of the ``reward_masked`` metric.
    """
    import torch

    scores = token_level_rewards.sum(dim=-1)
    masked = torch.isnan(scores)
    norm = True if config is None else bool(getattr(config, "norm_adv_by_std_in_grpo", True))
    adv = torch.zeros_like(scores)
    groups: dict[Any, list[int]] = {}
    for i, key in enumerate(index):
        if not bool(masked[i]):
            groups.setdefault(key, []).append(i)
    with torch.no_grad():
        for members in groups.values():
            vals = scores[members]
            if len(members) == 1:
                mean, std = torch.tensor(0.0), torch.tensor(1.0)
            else:
                mean, std = vals.mean(), vals.std()
            out = vals - mean
            adv[members] = out / (std + epsilon) if norm else out
    token_level_rewards.nan_to_num_(nan=0.0)
    advantages = adv.unsqueeze(-1) * response_mask
    return advantages, advantages


def register_verl_extensions() -> None:
    """Register ``grpo_masked`` with verl (idempotent). Runs on import when verl is loaded.

    ``trainer.run`` puts this module in ``VERL_USE_EXTERNAL_MODULES`` so that every verl
    process (the driver computing advantages included) imports it along with verl.
    """
    try:
        from verl.trainer.ppo import core_algos
    except ImportError:
        return
    registry = core_algos.ADV_ESTIMATOR_REGISTRY
    if registry.get(MASKED_ESTIMATOR) is not grpo_masked_advantage:
        registry[MASKED_ESTIMATOR] = grpo_masked_advantage


if "verl" in sys.modules:
    register_verl_extensions()
