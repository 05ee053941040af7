"""verl 0.9.1's v1 replay buffer, plus what the reward server reports, in every training step.

verl's v1 trainer logs the reward function's extra keys only in validation and dumps, and reads
the per-token scores (``rm_scores``) again for its ``critic/score/*`` metrics. This sampler is
verl's own extension point for that (``trainer.v1.sampler.custom_sampler``; ``trainer/run.py``'s
presets set it)::

    trainer:
      v1:
        sampler:
          custom_sampler:
            path: pkg://reward_server.integrations.verl_sampler
            name: RewardReplayBuffer          # RewardReplayBufferAsync for the async trainer modes

Each time the trainer samples a batch it

1. adds ``reward/<key>`` (mean over the batch's finite values) for every key the reward function
   returned (``score``, ``policy_invalid``, ``reward_masked``, ``s_target``, ``gamma``, ...) to
   the step's metrics, so they reach every logger every step;
2. turns each masked sample (``reward_masked`` = 1: the reward server was unreachable and
   ``mask_infra_failures`` is on) into what verl itself uses for a padding sample: score 0,
   response and loss masks 0, tagged ``is_padding``. It then contributes to no loss term (policy
   gradient, KL, entropy) and no token count they are averaged over, verl leaves it out of its
   score/advantage/length metrics, and ``grpo_masked`` leaves it out of its group's mean and std.

Like any custom sampler it is built without verl's DAPO arguments: ``algorithm.filter_groups``
is not supported with it (``trainer/run.py --check-config`` refuses the combination).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import torch
import transfer_queue as tq
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

from reward_server.components import MASK_SUFFIX

logger = logging.getLogger(__name__)
METRIC_PREFIX = "reward/"
MASK_FIELDS = ("rm_scores", "response_mask", "loss_mask")


def reward_infos(batch: KVBatchMeta) -> list[dict[str, Any]]:
    """Each sample's ``reward_extra_info`` (the reward function's dict), in batch order."""
    if not batch.keys:
        return []
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                           select_fields=["extra_fields"])
    out = []
    for value in list(data["extra_fields"]):
        fields = getattr(value, "data", value)
        info = fields.get("reward_extra_info", {}) if isinstance(fields, dict) else {}
        out.append(dict(info or {}))
    return out


def step_metrics(infos: Sequence[dict[str, Any]], prefix: str = METRIC_PREFIX) -> dict[str, float]:
    """``prefix + key``: mean over the samples' finite numeric values of each key, leaving out
    the samples whose ``<key>_mask`` is 0 (the component does not apply to them); the mask keys
    themselves average to the share of samples a component applies to."""
    values: dict[str, list[float]] = {}
    for info in infos:
        for key, value in info.items():
            if info.get(key + MASK_SUFFIX) == 0.0:
                continue
            if isinstance(value, bool | int | float) and math.isfinite(float(value)):
                values.setdefault(key, []).append(float(value))
    return {f"{prefix}{k}": sum(v) / len(v) for k, v in sorted(values.items()) if v}


def mask_samples(batch: KVBatchMeta, infos: Sequence[dict[str, Any]]) -> int:
    """Rewrite the masked samples of ``batch`` as padding-like samples (see the module doc)."""
    idx = [i for i, info in enumerate(infos) if float(info.get("reward_masked") or 0.0) == 1.0]
    if not idx:
        return 0
    keys = [batch.keys[i] for i in idx]
    data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=list(MASK_FIELDS))
    zeros = {}
    for name in MASK_FIELDS:
        rows = [row for row in data[name].unbind(0)] if data[name].is_nested else list(data[name])
        zeros[name] = torch.nested.as_nested_tensor([torch.zeros_like(r) for r in rows],
                                                    layout=torch.jagged)
    for i in idx:
        batch.tags[i]["is_padding"] = True
    tq.kv_batch_put(keys=keys, partition_id=batch.partition_id,
                    fields=TensorDict(zeros, batch_size=len(keys)), tags=[batch.tags[i] for i in idx])
    logger.warning("%d of %d samples masked (reward server unreachable past the retry budget)",
                   len(idx), len(batch.keys))
    return len(idx)


def _with_rewards(batch: KVBatchMeta, metrics: dict[str, Any], partition_id: str) -> dict[str, Any]:
    infos = reward_infos(batch)
    mask_samples(batch, infos)
    if partition_id != "val":
        metrics = {**metrics, **step_metrics(infos)}
    return metrics


class RewardReplayBuffer(ReplayBuffer):  # type: ignore[misc]
    """verl's sync replay buffer (``trainer.v1.trainer_mode: sync``) + the reward's metrics."""

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict[str, Any]]:
        batch, metrics = super().sample(global_steps, partition_id, batch_size)
        return batch, _with_rewards(batch, metrics, partition_id)


class RewardReplayBufferAsync(ReplayBufferAsync):  # type: ignore[misc]
    """verl's async replay buffer (``colocate_async`` / ``separate_async``) + the reward's metrics."""

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict[str, Any]]:
        batch, metrics = super().sample(global_steps, partition_id, batch_size)
        return batch, _with_rewards(batch, metrics, partition_id)
