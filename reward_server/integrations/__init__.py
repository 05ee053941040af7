"""Reward functions for RL frameworks, backed by the reward server.

- :mod:`reward_server.integrations.trl`: :class:`~reward_server.integrations.trl.RewardServerReward`,
  an async reward function for TRL's ``GRPOTrainer(reward_funcs=[...])``.
- :mod:`reward_server.integrations.verl`: ``compute_score`` for verl's
  ``reward.custom_reward_function`` (``path: pkg://reward_server.integrations.verl``) and the
  ``grpo_masked`` advantage estimator; :mod:`reward_server.integrations.verl_sampler`: verl's
  replay buffer with the reward's components in every step's metrics.
Both read each row through the training-row contract, :mod:`reward_server.api.rows` (each
row's ScoreItem template, written by ``python -m trainer.data.prepare``, read alike by the
server's OpenRLHF route), and log the components :mod:`reward_server.api.kinds` names for it.

Each needs only the base install (grpcio, protobuf, pydantic); the framework itself is imported
by the framework's own process.
"""
