"""Run by test_verl_trainer.py in a subprocess (it starts its own Ray: TransferQueue's controller
and storage actors take one CPU each, more than the suite's 2-CPU Ray can spare).

verl's own ``run_ppo`` initialises Ray with the runtime env our runner configures
(``verl_runner.configure_run``: ``VERL_USE_EXTERNAL_MODULES`` and the run's log paths) and starts
the TaskRunner actor: here :class:`ProbeTaskRunner`, which does what ``TaskRunnerV1.run`` does
up to the end of a training step, without GPUs: ``tq.init``, ``get_trainer_cls(trainer_mode)``
(verl's ``PPOTrainerSync``, building its replay buffer from our config), then the step's reward
part on the trajectories the test scored with our ``compute_score``: put them into TransferQueue
the way verl's agent loop does (``AgentLoopOutput.as_dict``), ``replay_buffer.sample``,
``_compute_advantage`` (verl's estimator registry) and ``_compute_metrics``.

    python verl_taskrunner_probe.py IN.json OUT.json
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import ray  # noqa: E402

IN_ENV, OUT_ENV = "PROBE_IN", "PROBE_OUT"


def put_trajectories(trajectories: list[dict[str, Any]], tag: str) -> None:
    """Into TransferQueue as verl's agent loop writes them (agent_loop_tq._agent_loop_postprocess)."""
    import torch
    import transfer_queue as tq
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    keys, fields, tags = [], [], []
    for uid in sorted({t["uid"] for t in trajectories}):
        tq.kv_put(key=f"{tag}{uid}", partition_id="train",
                  tag={"is_prompt": True, "status": "finished", "global_steps": 1})
    for t in trajectories:
        n = t["response_len"]
        out = AgentLoopOutput(prompt_ids=[1, 2, 3, 4], response_ids=[5] * n, response_mask=[1] * n,
                              reward_score=t["info"]["score"], num_turns=2, metrics=AgentLoopMetrics(),
                              extra_fields={"reward_extra_info": t["info"]})
        field = out.as_dict()
        field.update(uid=f"{tag}{t['uid']}", session_id=t["session"], global_steps=1)
        field["loss_mask"] = field["response_mask"]
        field["input_ids"] = torch.cat([field["prompts"], field["responses"]])
        field["old_log_probs"] = torch.zeros(n)  # as _compute_old_log_prob leaves it
        keys.append(f"{tag}{t['uid']}_{t['session']}_0")
        fields.append(field)
        tags.append({"status": "success", "prompt_len": 4, "response_len": n, "seq_len": 4 + n,
                     "global_steps": 1, "min_global_steps": 1, "max_global_steps": 1})
    tq.kv_batch_put(keys=keys, fields=list_of_dict_to_tensordict(fields), tags=tags, partition_id="train")


def one_step(config: Any, trajectories: list[dict[str, Any]], tag: str) -> dict[str, Any]:
    import transfer_queue as tq
    from verl.trainer.ppo.v1 import get_trainer_cls

    trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config)
    put_trajectories(trajectories, tag)
    prompts = len({t["uid"] for t in trajectories})
    batch, sample_metrics = trainer.replay_buffer.sample(global_steps=1, partition_id="train",
                                                         batch_size=prompts)
    metrics = dict(sample_metrics)
    batch = trainer._compute_advantage(batch, metrics)
    trainer._init_resource_pool_mgr()  # what _compute_metrics reads the GPU count from
    trainer._compute_metrics(batch, metrics, {"step": 1.0, "gen": 0.5}, global_steps=1, epoch=0)
    adv = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["advantages"])
    advantages = {k.removeprefix(tag): [float(x) for x in a.tolist()]
                  for k, a in zip(batch.keys, adv["advantages"].unbind(0), strict=True)}
    tq.kv_clear(keys=batch.keys, partition_id="train")
    return {"sampler": type(trainer.replay_buffer).__name__, "advantages": advantages,
            "metrics": {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}}


@ray.remote
class ProbeTaskRunner:
    """Stands where verl's TaskRunnerV1 stands (same actor, same runtime env)."""

    def run(self, config: Any) -> None:
        import transfer_queue as tq
        from omegaconf import open_dict

        seen = {"external_modules": os.environ.get("VERL_USE_EXTERNAL_MODULES"),
                "file_logger": os.environ.get("VERL_FILE_LOGGER_PATH"),
                "our_module_loaded_before_use": "reward_server.integrations.verl" in sys.modules}
        from verl.trainer.ppo import core_algos  # verl is imported here: its external modules load

        seen["registered"] = "grpo_masked" in core_algos.ADV_ESTIMATOR_REGISTRY
        seen["our_module_loaded_by_verl"] = "reward_server.integrations.verl" in sys.modules
        payload = json.loads(Path(os.environ[IN_ENV]).read_text())
        config.transfer_queue.enable = True
        tq.init(config.transfer_queue)
        try:
            results = {name: one_step(config, trajs, f"{name}-")
                       for name, trajs in payload["batches"].items()}
            with open_dict(config):  # the same batch through verl's own replay buffer
                config.trainer.v1.sampler.custom_sampler.path = None
                config.trainer.v1.sampler.custom_sampler.name = None
            results["verl_sampler"] = one_step(config, payload["batches"]["masked"], "plain-")
        finally:
            tq.close()
        Path(os.environ[OUT_ENV]).write_text(json.dumps({"seen": seen, "results": results}))


def main() -> int:
    from verl.trainer.main_ppo import run_ppo

    from trainer import verl_runner

    payload = json.loads(Path(sys.argv[1]).read_text())
    config = verl_runner.compose("rubric_generator", payload["overrides"])
    verl_runner.check(config, "rubric_generator")
    verl_runner.configure_run(config, Path(payload["run_dir"]))
    verl_runner.set_ray_env(config, {IN_ENV: sys.argv[1], OUT_ENV: sys.argv[2]})
    os.environ.pop("VERL_USE_EXTERNAL_MODULES", None)  # only the runtime env carries it to the actor
    run_ppo(config, task_runner_class=ProbeTaskRunner)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
