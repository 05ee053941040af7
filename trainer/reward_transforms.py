"""Control arms for "does it learn?": the step's rewards transformed before GRPO sees them.

``none``     the rewards as the server gave them (every real run);
``shuffle``  permuted at random across the step's completions (the generation batch, all
             processes together): the same values, no longer tied to the text they scored, so
             a policy must NOT learn from them;
``negate``   the sign flipped: the policy must get WORSE at the true reward.

They exist to check the training path itself (a sign error, rewards misaligned with their rows,
advantages that are all ties would pass both controls or fail the real arm), never for a real
run. The transform is applied by :func:`transforming_trainer`'s ``_calculate_rewards`` after
TRL gathers the rewards of every process and before it computes advantages, in training only
(an evaluation scores the true reward); the untransformed mean is logged beside TRL's
``reward`` as ``reward_raw`` (the number to watch).
"""

from __future__ import annotations

from typing import Any

TRANSFORMS = ("none", "shuffle", "negate")


def transform_rewards(rewards: Any, kind: str, *, seed: int) -> Any:
    """``rewards`` (a tensor, one row per completion, one column per reward function)
    transformed; ``shuffle`` permutes the rows with finite rewards among themselves (a masked
    completion stays masked), with a permutation that depends on ``seed`` alone (the same on
    every process)."""
    import torch

    if kind not in TRANSFORMS:
        raise ValueError(f"reward transform {kind!r}: choose one of {TRANSFORMS}")
    if kind == "none":
        return rewards
    if kind == "negate":
        return -rewards
    out = rewards.clone()
    rows = torch.isfinite(rewards).all(dim=1).nonzero(as_tuple=True)[0]
    generator = torch.Generator().manual_seed(seed)
    order = rows[torch.randperm(len(rows), generator=generator)]
    out[rows] = rewards[order]
    return out


def transforming_trainer(base: type[Any], kind: str) -> type[Any]:
    """``base`` (a ``GRPOTrainer`` class) whose rewards go through :func:`transform_rewards`
    (``base`` itself for ``none``)."""
    if kind not in TRANSFORMS:
        raise ValueError(f"reward transform {kind!r}: choose one of {TRANSFORMS}")
    if kind == "none":
        return base
    import torch

    class TransformingGRPOTrainer(base):  # type: ignore[misc]
        reward_transform = kind

        def _calculate_rewards(self, *args: Any, **kwargs: Any) -> Any:
            rewards = super()._calculate_rewards(*args, **kwargs)
            if not self.model.training:  # evaluation scores the true reward
                return rewards
            finite = rewards[torch.isfinite(rewards).all(dim=1)]
            if len(finite):
                weights = self.reward_weights.to(finite.device)
                self._metrics["train"]["reward_raw"].append(float((finite * weights).sum(dim=1).mean()))
            seed = hash((self.args.seed, self.state.global_step, self._step)) & 0x7FFFFFFF
            return transform_rewards(rewards, kind, seed=seed)

    return TransformingGRPOTrainer
