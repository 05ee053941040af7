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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)
progress = logging.getLogger("trainer.progress")


NOT_COMPONENTS = frozenset({"wait_s", "masked", "reward_masked"})  # logged beside, not parts


def reward_rows(log_path: Path) -> list[dict[str, float]]:
    """``{"step", "reward", "reward_std", "reward/<component>"...}`` per logged training step,
    from either engine's log (components: every numeric ``reward/*`` key but the call's wait
    and masking counters)."""
    rows: list[dict[str, float]] = []
    for line in Path(log_path).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        data = row.get("data", row)
        reward = data.get("reward", data.get("critic/score/mean"))
        if isinstance(reward, int | float):
            std = data.get("reward_std", 0.0)
            out = {"step": float(row.get("step", len(rows) + 1)), "reward": float(reward),
                   "reward_std": float(std) if isinstance(std, int | float) else 0.0}
            out.update({k: float(v) for k, v in data.items() if k.startswith("reward/")
                        and k.split("/", 1)[1] not in NOT_COMPONENTS and not k.endswith("_mask")
                        and isinstance(v, int | float)
                        and math.isfinite(v)})
            rows.append(out)
    return rows


def data_kinds(path: Path) -> list[str]:
    """The reward kinds of a prepared parquet (verl ``extra_info`` or TRL ``extra_info_json``)."""
    import pyarrow.parquet as pq

    names = pq.read_schema(path).names
    if "extra_info_json" in names:
        extras = [json.loads(x) for x in pq.read_table(path, columns=["extra_info_json"])
                  .column("extra_info_json").to_pylist()]
    elif "extra_info" in names:
        extras = pq.read_table(path, columns=["extra_info"]).column("extra_info").to_pylist()
    else:
        return []
    return sorted({str(e["kind"]) for e in extras if isinstance(e, dict) and e.get("kind")})


def plot_title(engine: str, *, kinds: Sequence[str], policy: str, run_dir: Path) -> str:
    """``<engine> GRPO reward per step: <kinds>`` over ``policy <m>, judge <m>, NLI <m>`` (the
    judge and NLI models from the run's ``provenance.json``, the server's own Info)."""
    prov: dict[str, Any] = {}
    path = Path(run_dir) / "provenance.json"
    if path.is_file():
        prov = json.loads(path.read_text(encoding="utf-8"))
    judge, nli = prov.get("judge_model") or "?", prov.get("nli_model") or "?"
    return (f"{engine} GRPO reward per step: {', '.join(kinds) or 'reward'}\n"
            f"policy {policy}, judge {judge}, NLI {nli}")


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
    """Reward per step (mean and the band of one std) over the reward's components per step
    (components outside [0, 1], such as counts, on a right-hand axis); integer step ticks.
    None when the log has no step yet."""
    if not Path(log_path).is_file():
        logger.warning("no run log at %s: nothing to plot", log_path)
        return None
    rows = reward_rows(log_path)
    if not rows:
        logger.warning("%s has no reward rows: nothing to plot", log_path)
        return None
    import matplotlib.pyplot as plt

    fig = reward_figure(rows, title=title)
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return Path(png)


def reward_figure(rows: Sequence[dict[str, float]], *, title: str) -> Any:
    """The figure of :func:`plot_rewards` from :func:`reward_rows` (matplotlib, Agg backend);
    the caller saves and closes it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    steps = [r["step"] for r in rows]
    mean = [r["reward"] for r in rows]
    std = [r["reward_std"] for r in rows]
    names = sorted({k for r in rows for k in r if k.startswith("reward/")})
    fig, (ax, cax) = plt.subplots(2, 1, sharex=True, figsize=(8, 6.5),
                                  gridspec_kw={"height_ratios": [3, 2]})
    ax.plot(steps, mean, marker="o", label="reward (mean)")
    ax.fill_between(steps, [m - s for m, s in zip(mean, std, strict=True)],
                    [m + s for m, s in zip(mean, std, strict=True)], alpha=0.2, label="± std")
    ax.set_ylabel("reward")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="best", fontsize=8)
    _plot_components(cax, rows, names)
    distinct = sorted(set(steps))
    if len(distinct) <= 12:  # every step its tick (one step included)
        cax.set_xticks(distinct)
    else:
        cax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if len(distinct) == 1:
        cax.set_xlim(distinct[0] - 0.5, distinct[0] + 0.5)
    cax.set_xlabel("step")
    fig.tight_layout()
    return fig


def _colors(n: int) -> list[Any]:
    """n distinct colours (tab10, tab20 beyond ten), one per component across both axes."""
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _plot_components(ax: Any, rows: Sequence[dict[str, float]], names: Sequence[str]) -> None:
    if not names:
        ax.text(0.5, 0.5, "no reward components in the log", ha="center", va="center",
                transform=ax.transAxes)
        return
    values = {n: [(r["step"], r[n]) for r in rows if n in r] for n in names}
    unit = [n for n in names if all(0.0 <= v <= 1.0 for _, v in values[n])]
    other = [n for n in names if n not in unit]
    right = ax.twinx() if other and unit else None
    colors = _colors(len(names))
    for axis, group, style in ((ax, unit, "-"), (right or ax, other, "--")):
        for n in group:
            xs, ys = zip(*values[n], strict=True)
            axis.plot(xs, ys, style, marker=".", color=colors[names.index(n)],
                      label=n.split("/", 1)[1])
    ax.set_ylabel("component (0..1)" if unit else "component")
    if right is not None:
        right.set_ylabel("component (other scale, dashed)")
    handles = [h for a in (ax, right) if a is not None for h in a.get_legend_handles_labels()[0]]
    ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.08 if right else 1.01, 0.5),
              fontsize=7, frameon=False)
