"""verl (0.9.1): the reward server as verl's custom reward function, and the ``grpo_masked``
advantage estimator. Imported by package path, so every verl process shares one module::

    reward:
      custom_reward_function:
        path: pkg://reward_server.integrations.verl
        name: compute_score
        reward_kwargs: {reward_server: "HOST:50051"}    # or $REWARD_SERVER_ADDRESS

``reward_server`` may name several ingresses (``"10.0.0.1:50051,10.0.0.2:50051"``, a list, or
``dns:///name:50051``): the client spreads calls over them round robin and skips a dead one
(:func:`reward_server.client.channel_target`).

verl's reward loop (``naive`` manager) awaits, once per finished rollout::

    await compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...,
                        **reward.custom_reward_function.reward_kwargs)

Everything the reward needs is in ``extra_info`` (written by ``python -m trainer.data.prepare``,
see :mod:`reward_server.api.rows`); the reward kwargs say where the server is and
how long a call may try (:class:`reward_server.client.RetryBudget`): ``attempts``,
``backoff_cap_s``, ``deadline_s``.

Concurrent ``compute_score`` calls of one reward-loop worker are merged into one Score call
(:mod:`reward_server.client.coalesce`): each call waits up to ``coalesce_window_ms`` (2) for others, up
to ``coalesce_max_items`` (64) items per call; ``coalesce_max_items: 1`` turns it off. Each
rollout still gets its own result or its own error. On by default: verl awaits one call per
finished rollout, and merged calls cost the server a fraction of the CPU per item.

The result is a dict with fixed keys (verl builds its metric
arrays from the first result's keys): ``score``, ``policy_invalid``, ``reward_masked`` and the
fixed components of the row's item (:attr:`reward_server.api.rows.Row.component_names`: a
weighted row's parts' own), each with ``<name>_mask`` (a component the server did not compute for
this sample, e.g. after a policy-invalid output, is 0.0 with mask 0.0: every value is finite,
since verl averages them with ``np.mean``; the valid-only mean is ``mean(name) / mean(name_mask)``).

Unless ``mask_infra_failures`` is on, the first call of a process probes the server once
(``Info``, ``probe_timeout_s``, 10 s by default): a server that is not there fails it in seconds
with one line naming the address, the status and the fix, instead of after ``deadline_s``.

An infrastructure failure never becomes a score. By default the call raises with the server's
status and message; verl 0.9.1's v1 trainer treats that as a failed rollout: it logs the error,
leaves the rollout out of its group and trains on the rest (when every rollout of a prompt
failed, the step stops). With ``mask_infra_failures=True`` the sample is kept but masked
(``score`` NaN, ``reward_masked`` 1): :mod:`reward_server.integrations.verl_sampler` turns it into
a sample that contributes to no loss term and no metric, and ``grpo_masked`` leaves it out of
its group's mean and std. Plain ``grpo`` would turn the whole group NaN: use
``algorithm.adv_estimator=grpo_masked`` with masking.

``grpo_masked`` is registered with verl when this module is imported in a process that has verl:
the ``verl.plugins`` entry point of the installed package, or
``VERL_USE_EXTERNAL_MODULES=reward_server.integrations.verl`` in the Ray runtime env (what
``trainer/run.py`` sets), make verl import it in every process, the TaskRunner included.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import logging
import math
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from reward_server import components
from reward_server.api.rows import read_row
from reward_server.client import (
    TOKEN_ENV,
    AsyncRewardClient,
    CoalesceSettings,
    RetryBudget,
    RewardCallError,
    bearer_token,
)
from reward_server.domain import ItemResult, ItemStatus
from reward_server.integrations.probe import PROBE_TIMEOUT_S, ServerUnreachable, probe

logger = logging.getLogger(__name__)

ADDRESS_ENV = "REWARD_SERVER_ADDRESS"
MASKED_ESTIMATOR = "grpo_masked"
MODULE = __name__
# keyword arguments verl's reward managers pass besides the four documented ones
_VERL_CALL_KWARGS = frozenset({"reward_router_address", "reward_model_tokenizer"})

# per event loop, keyed by the loop itself (an id() of a dead loop can be reused by a new one,
# which would get clients whose channels belong to the dead loop); a closed loop's entry is
# dropped when the next loop makes its first client. Then per (server, token, budget).
_clients: dict[asyncio.AbstractEventLoop, dict[tuple[Any, ...], AsyncRewardClient]] = {}
# the start-up probe, once per (server, token, event loop) (the loop itself, as above)
_probes: dict[tuple[Any, ...], asyncio.Future[Any]] = {}
_lock = threading.Lock()
_counts = {"scored": 0, "policy_invalid": 0, "masked": 0}


def counters() -> dict[str, int]:
    """Samples scored, policy-invalid and masked by this process (for logs and tests)."""
    return dict(_counts)


def _client(
    address: str, token: str | None, budget: RetryBudget, coalesce: CoalesceSettings | None
) -> AsyncRewardClient:
    """One client per (event loop, server, budget): grpc.aio channels belong to their loop,
    and concurrent calls merge only on one client."""
    key = (address, token, budget, coalesce)
    with _lock:
        loop = asyncio.get_running_loop()
        if loop not in _clients:
            for dead in [lp for lp in _clients if lp.is_closed()]:
                del _clients[dead]  # its channels died with it; nothing left to close
        mine = _clients.setdefault(loop, {})
        client = mine.get(key)
        if client is None:
            client = mine[key] = AsyncRewardClient(address, token=token, retry=budget,
                                                   coalesce=coalesce)
        return client


def result_to_dict(names: Sequence[str], result: ItemResult) -> dict[str, float]:
    """The fixed-key dict verl logs for one scored sample whose row's item reports the fixed
    components ``names`` (:attr:`~reward_server.api.rows.Row.component_names`): every value
    finite. A component the
    server did not compute for this sample (e.g. after a policy-invalid output) is 0.0 with
    ``<name>_mask`` 0.0 (:func:`reward_server.components.with_masks`): verl averages these with
    ``np.mean`` and needs the same keys on every sample, so the valid-only mean of a component
    over a batch is ``mean(name) / mean(name_mask)``."""
    assert result.reward is not None, "an OK/POLICY_INVALID result always carries a reward"
    out = {"score": float(result.reward),
           "policy_invalid": 1.0 if result.status is ItemStatus.POLICY_INVALID else 0.0,
           "reward_masked": 0.0}
    out.update(components.with_masks(names, result.components))
    return out


def masked_dict(names: Sequence[str]) -> dict[str, float]:
    """A sample masked after an infrastructure failure: ``score`` NaN (what ``grpo_masked``
    leaves out), ``reward_masked`` 1, every component of ``names`` absent (0.0, mask 0.0)."""
    out = {"score": math.nan, "policy_invalid": 0.0, "reward_masked": 1.0}
    out.update(components.with_masks(names, {}))
    return out


async def _probe_once(address: str, token: str | None, timeout_s: float) -> None:
    """The start-up probe, once per (server, event loop): the first call of a run fails within
    ``probe_timeout_s`` with one line (:class:`~reward_server.integrations.probe.ServerUnreachable`)
    instead of waiting out the call's ``deadline_s``; concurrent first calls share it."""
    key = (address, token, asyncio.get_running_loop())
    with _lock:
        task = _probes.get(key)
        if task is None:  # a new (server, loop): drop closed loops' entries, as _client does
            for dead in [k for k in _probes if k[2].is_closed()]:
                del _probes[dead]
            task = _probes[key] = asyncio.ensure_future(probe(address, token=token, timeout_s=timeout_s,
                                                              address_flag="reward_kwargs.reward_server",
                                                              timeout_flag="reward_kwargs.probe_timeout_s"))
    try:
        await asyncio.shield(task)
    except ServerUnreachable:
        with _lock:
            if _probes.get(key) is task:
                del _probes[key]  # the next call probes again
        raise


async def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any = None,
    extra_info: Mapping[str, Any] | None = None,
    *,
    reward_server: str | Sequence[str] | None = None,
    token_env: str = TOKEN_ENV,
    attempts: int = RetryBudget.attempts,
    backoff_cap_s: float = RetryBudget.backoff_cap_s,
    deadline_s: float = RetryBudget.deadline_s,
    mask_infra_failures: bool = False,
    coalesce_window_ms: float = 1000 * CoalesceSettings.window_s,
    coalesce_max_items: int = CoalesceSettings.max_items,
    probe_timeout_s: float = PROBE_TIMEOUT_S,
    **verl_kwargs: Any,
) -> dict[str, float]:
    """Score one rollout on the reward server; see the module doc for the contract."""
    unknown = sorted(set(verl_kwargs) - _VERL_CALL_KWARGS)
    if unknown:
        raise TypeError(f"compute_score got unknown reward_kwargs {unknown}; known: "
                        f"{sorted(reward_kwarg_names())}")
    if extra_info is None:
        raise ValueError(f"{data_source}: extra_info is missing; prepare the data with "
                         "`python -m trainer.data.prepare`")
    given = reward_server or os.environ.get(ADDRESS_ENV)
    # several ingresses: a list from Hydra (ListConfig) or "a:p,b:q"; one string keys the cache
    address = given if isinstance(given, str) or given is None else ",".join(map(str, given))
    if not address:
        raise ValueError(f"no reward server address: set reward_kwargs.reward_server=host:port "
                         f"or ${ADDRESS_ENV}")
    row = read_row(extra_info)
    item = row.item(solution_str, item_id=f"{row.user_id}#{row.index}")
    budget = RetryBudget(attempts=attempts, backoff_cap_s=backoff_cap_s, deadline_s=deadline_s,
                         backoff_initial_s=min(RetryBudget.backoff_initial_s, backoff_cap_s))
    coalesce = (CoalesceSettings(window_s=coalesce_window_ms / 1000, max_items=coalesce_max_items)
                if coalesce_max_items > 1 else None)
    token = bearer_token(token_env)  # $token_env, else the file $<token_env>_FILE
    if not mask_infra_failures:  # masking rides out an absent server by design: no probe
        await _probe_once(address, token, probe_timeout_s)
    client = _client(address, token, budget, coalesce)
    try:
        (result,) = await client.score([item])
    except RewardCallError as e:
        if not mask_infra_failures:
            raise
        _counts["masked"] += 1
        logger.warning("reward masked (%d so far) for %s user %s: %s %s", _counts["masked"],
                       data_source, extra_info.get("user_id"), e.code.name, e.details)
        return masked_dict(row.component_names)
    _counts["scored"] += 1
    if result.status is ItemStatus.POLICY_INVALID:
        _counts["policy_invalid"] += 1
        logger.debug("policy-invalid output for user %s: %s", extra_info.get("user_id"),
                     result.message)
    return result_to_dict(row.component_names, result)


def reward_kwarg_names() -> frozenset[str]:
    """The ``reward_kwargs`` :func:`compute_score` accepts (what a config may set)."""
    params = inspect.signature(compute_score).parameters.values()
    return frozenset(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


async def close_clients() -> None:
    """Close this event loop's clients (verl never calls it; tests do)."""
    with _lock:
        clients = _clients.pop(asyncio.get_running_loop(), {}).values()
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
    """GRPO outcome advantage where masked samples are left out.

    A sample is masked when its score is NaN (``mask_infra_failures``) or its response mask is
    all zero (what :mod:`~reward_server.integrations.verl_sampler` makes of a masked sample,
    as verl does for its padding samples). Per group (same ``index``): mean and std over the
    unmasked scores only (a group with one unmasked sample gets mean 0, std 1, as verl's GRPO
    does for singletons); masked samples get advantage 0. NaN rewards are zeroed in place.
    """
    import torch

    scores = token_level_rewards.sum(dim=-1)
    masked = torch.isnan(scores) | (response_mask.sum(dim=-1) == 0)
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


def register() -> None:
    """Register ``grpo_masked`` with verl's estimator registry (idempotent)."""
    from verl.trainer.ppo import core_algos

    if core_algos.ADV_ESTIMATOR_REGISTRY.get(MASKED_ESTIMATOR) is not grpo_masked_advantage:
        core_algos.register_adv_est(MASKED_ESTIMATOR)(grpo_masked_advantage)


if importlib.util.find_spec("verl") is not None:
    register()
