"""Every module verl 0.9.1's trainer imports on its way to the first step (``main_ppo`` ->
``TaskRunnerV1.run`` -> the v1 trainer, TransferQueue, the agent loop and its rollout router, the
reward loop, the engine workers) imports here: a dependency missing from the ``train`` extra
fails CI instead of a cluster's start-up. (The vLLM rollout itself needs the ``gpu`` extra.)"""

from __future__ import annotations

import importlib

import pytest

pytest.importorskip("verl", reason="verl is the train extra: pip install -e .[train]")

TASK_RUNNER_PATH = (
    "verl.trainer.main_ppo",
    "transfer_queue",  # TaskRunnerV1.run: `import transfer_queue as tq`
    "verl.trainer.ppo.v1",  # get_trainer_cls and the trainers
    "verl.trainer.ppo.v1.trainer_sync",
    "verl.trainer.ppo.v1.agent_loop_tq",
    "verl.trainer.ppo.v1.replay_buffer",
    "verl.workers.rollout.router",  # imports cachetools
    "verl.workers.rollout.replica",
    "verl.experimental.agent_loop",
    "verl.experimental.reward_loop",
    "verl.workers.engine_workers",
    "verl.checkpoint_engine",  # its NCCL/HCCL engines need zmq
    "verl.utils.tracking",
    # ours, loaded by verl through its extension points
    "reward_server.integrations.verl",
    "reward_server.integrations.verl_sampler",
)


@pytest.mark.parametrize("module", TASK_RUNNER_PATH)
def test_the_task_runner_path_imports(module: str) -> None:
    importlib.import_module(module)


def test_the_sampler_and_reward_fn_load_the_way_verl_loads_them() -> None:
    from verl.utils.import_utils import load_extern_object

    from trainer import verl_runner

    config = verl_runner.compose("rubric_generator")
    fn = config.reward.custom_reward_function
    sampler = config.trainer.v1.sampler.custom_sampler
    assert load_extern_object(fn.path, fn.name).__module__ == "reward_server.integrations.verl"
    assert load_extern_object(sampler.path, sampler.name).__name__ == "RewardReplayBuffer"
