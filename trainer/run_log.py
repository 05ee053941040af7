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
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reward_server.api.rows import read_row

logger = logging.getLogger(__name__)
progress = logging.getLogger("trainer.progress")


NOT_COMPONENTS = frozenset({"wait_s", "score_s", "masked", "reward_masked"})  # logged beside, not parts


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
        extras = pq.read_table(path, columns=["extra_info_json"]).column("extra_info_json").to_pylist()
    elif "extra_info" in names:
        extras = pq.read_table(path, columns=["extra_info"]).column("extra_info").to_pylist()
    else:
        return []
    return sorted({read_row(e).kind.value for e in extras if e})


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
    (those in [0, 1] in one panel, the rest, such as counts, in a panel of their own); integer
    step ticks; legends beside the panels, never over data. None when the log has no step yet."""
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


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
LINESTYLES = ("-", "--", "-.", ":")


def reward_figure(rows: Sequence[dict[str, float]], *, title: str) -> Any:
    """The figure of :func:`plot_rewards` from :func:`reward_rows` (matplotlib, Agg backend);
    the caller saves and closes it. Components equal at every step are drawn as one line whose
    legend entry names them all (``all_satisfied = policy_invalid``), so none hides behind
    another; every line has its own marker and dash, and its legend entry its last value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    steps = [r["step"] for r in rows]
    mean = [r["reward"] for r in rows]
    std = [r["reward_std"] for r in rows]
    names = sorted({k for r in rows for k in r if k.startswith("reward/")})
    values = {n: [(r["step"], r[n]) for r in rows if n in r] for n in names}
    unit = [n for n in names if all(0.0 <= v <= 1.0 for _, v in values[n])]
    other = [n for n in names if n not in unit]
    heights = [3.0, 2.4] + ([1.4] if other else [])
    fig, axes = plt.subplots(len(heights), 1, sharex=True, figsize=(9.5, 2.2 * sum(heights) / 2.4 + 1.2),
                             gridspec_kw={"height_ratios": heights}, layout="constrained")
    ax, cax = axes[0], axes[1]
    ax.plot(steps, mean, marker="o", label=f"reward (mean), last {mean[-1]:.3g}")
    ax.fill_between(steps, [m - s for m, s in zip(mean, std, strict=True)],
                    [m + s for m, s in zip(mean, std, strict=True)], alpha=0.2, label="± 1 std")
    ax.set_ylabel("reward")
    ax.set_title(title, fontsize=10)
    _beside(ax)
    colors = _colors(len(names))
    if not names:
        cax.text(0.5, 0.5, "no reward components in the log", ha="center", va="center",
                 transform=cax.transAxes)
    _plot_components(cax, unit, values, colors={n: colors[names.index(n)] for n in names})
    cax.set_ylabel("component (0..1)")
    if unit:
        cax.set_ylim(-0.06, 1.06)  # a line at 0 or 1 is not drawn on the frame
    if other:
        _plot_components(axes[2], other, values, colors={n: colors[names.index(n)] for n in names})
        axes[2].set_ylabel("component\n(other scale)")
        axes[2].margins(y=0.15)  # the extremes not on the frame
    last = axes[-1]
    distinct = sorted(set(steps))
    if len(distinct) <= 12:  # every step its tick (one step included)
        last.set_xticks(distinct)
    else:
        last.xaxis.set_major_locator(MaxNLocator(integer=True))
    if len(distinct) == 1:
        last.set_xlim(distinct[0] - 0.5, distinct[0] + 0.5)
    last.set_xlabel("step")
    return fig


def _beside(ax: Any) -> None:
    """The legend to the right of ``ax``, outside the data area."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False,
                  borderaxespad=0.0)


def _colors(n: int) -> list[Any]:
    """n distinct colours (tab10, tab20 beyond ten), one per component across the panels."""
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def same_series(names: Sequence[str], values: dict[str, list[tuple[float, float]]]) -> list[list[str]]:
    """``names`` grouped by identical (step, value) series, in first-seen order."""
    groups: dict[tuple[tuple[float, float], ...], list[str]] = {}
    for n in names:
        groups.setdefault(tuple(values[n]), []).append(n)
    return list(groups.values())


def _plot_components(ax: Any, names: Sequence[str], values: dict[str, list[tuple[float, float]]],
                     *, colors: dict[str, Any]) -> None:
    for i, group in enumerate(same_series(names, values)):
        xs, ys = zip(*values[group[0]], strict=True)
        label = textwrap.fill(" = ".join(n.split("/", 1)[1] for n in group), 44)
        constant = len(set(ys)) == 1
        ax.plot(xs, ys, LINESTYLES[i % len(LINESTYLES)], marker=MARKERS[i % len(MARKERS)],
                markersize=5, color=colors[group[0]], linewidth=1.4,
                label=f"{label}: {'constant ' if constant else 'last '}{ys[-1]:.3g}")
    _beside(ax)
