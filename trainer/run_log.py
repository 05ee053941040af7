"""The run log both engines write (``run_log.jsonl``, one JSON object per logged step) and the
reward plot drawn from it.

TRL rows are written by :func:`jsonl_callback`: ``{"step", "reward", "reward_std",
"reward/<component>", ...}``. verl rows come from verl's own ``file`` logger: ``{"step",
"data": {"critic/score/mean", "reward/<component>", ...}}``. :func:`reward_rows` reads both.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)
progress = logging.getLogger("trainer.progress")


def reward_rows(log_path: Path) -> list[dict[str, float]]:
    """``{"step", "reward", "reward_std"}`` per logged training step, from either engine's log."""
    rows: list[dict[str, float]] = []
    for line in Path(log_path).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        data = row.get("data", row)
        reward = data.get("reward", data.get("critic/score/mean"))
        if isinstance(reward, int | float):
            std = data.get("reward_std", 0.0)
            rows.append({"step": float(row.get("step", len(rows) + 1)), "reward": float(reward),
                         "reward_std": float(std) if isinstance(std, int | float) else 0.0})
    return rows


def step_line(step: int, max_steps: int, logs: dict[str, Any]) -> str:
    """One line per training step: reward, step time and the time spent waiting for it."""
    def num(key: str) -> float:
        v = logs.get(key)
        return float(v) if isinstance(v, int | float) else math.nan

    return (f"step {step}/{max_steps}  reward {num('reward'):.4f} ± {num('reward_std'):.4f}  "
            f"step {num('step_time'):.1f}s  reward wait {num('reward/wait_s'):.2f}s")


def jsonl_callback(log_path: Path, max_steps: int) -> Any:
    """A transformers TrainerCallback appending each log to ``log_path`` and printing a step line."""
    from transformers import TrainerCallback

    class JsonlLog(TrainerCallback):  # type: ignore[misc]
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if not logs or not state.is_world_process_zero:
                return
            row = {"step": state.global_step, **{k: v for k, v in logs.items() if isinstance(v, int | float)}}
            with log_path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(row) + "\n")
            if "reward" in row:
                progress.info(step_line(state.global_step, max_steps, row))

    return JsonlLog()


def plot_rewards(log_path: Path, png: Path, *, title: str = "GRPO reward per step") -> Path | None:
    """Reward per step (mean and the band of one std); None when the log has no step yet."""
    if not Path(log_path).is_file():
        logger.warning("no run log at %s: nothing to plot", log_path)
        return None
    rows = reward_rows(log_path)
    if not rows:
        logger.warning("%s has no reward rows: nothing to plot", log_path)
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    steps = [r["step"] for r in rows]
    mean = [r["reward"] for r in rows]
    std = [r["reward_std"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, mean, marker="o", label="reward (mean)")
    ax.fill_between(steps, [m - s for m, s in zip(mean, std, strict=True)],
                    [m + s for m, s in zip(mean, std, strict=True)], alpha=0.2, label="± std")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return Path(png)
