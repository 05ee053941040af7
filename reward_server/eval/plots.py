"""Readable bar and line charts for the eval commands (matplotlib, the ``eval`` extra).

Every bar carries its value; a missing value is written ``n/a`` where its bar would be (and the
legend says what n/a means), and a zero bar is drawn as a visible outline on the axis with its
``0.0`` label. Legends sit beside the axes, never over bars or their labels.
"""

from __future__ import annotations

import logging
import math
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, or None (with a warning) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed (extra 'eval'); no plot written")
        return None
    return plt


def _missing(v: float | None) -> bool:
    return v is None or not math.isfinite(v)


def grouped_bars(
    ax: Any,
    groups: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    *,
    ylabel: str,
    title: str,
    ymax: float = 100.0,
) -> None:
    """One cluster of bars per group, one bar per series, each labelled with its value."""
    n = max(1, len(series))
    width = 0.8 / n
    lift = 0.012 * ymax
    for k, (name, values) in enumerate(series.items()):
        xs = [i - 0.4 + width * (k + 0.5) for i in range(len(groups))]
        heights = [0.0 if _missing(v) else float(v) for v in values]  # type: ignore[arg-type]
        bars = ax.bar(xs, heights, width, label=name, edgecolor="black", linewidth=0.6)
        for x, v, bar in zip(xs, values, bars, strict=True):
            if _missing(v):
                ax.text(x, lift, "n/a", ha="center", va="bottom", fontsize=7, rotation=90)
                continue
            assert v is not None
            if v == 0:
                bar.set_height(0.008 * ymax)  # a visible sliver on the axis
            ax.text(x, max(v, 0.0) + lift, f"{v:.1f}", ha="center", va="bottom", fontsize=7, rotation=90)
    ax.set_xticks(range(len(groups)), groups, rotation=20, ha="right")
    ax.set_ylim(0, ymax * 1.18)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.axhline(0, color="black", linewidth=0.8)
    handles, labels = ax.get_legend_handles_labels()
    if any(_missing(v) for values in series.values() for v in values):
        from matplotlib.patches import Patch

        handles.append(Patch(visible=False))
        labels.append("n/a: no value (none valid or not run; the JSON says why)")
    beside(ax, handles, labels)


def beside(ax: Any, handles: Sequence[Any], labels: Sequence[str]) -> None:
    """The legend to the right of ``ax`` (outside its data area), long labels wrapped."""
    ax.legend(handles, [textwrap.fill(label, 30) for label in labels], fontsize=7,
              loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)


def save(fig: Any, path: Path) -> None:
    """Write ``fig`` with everything drawn outside the axes (legends) inside the picture."""
    fig.tight_layout()
    fig.savefig(path, dpi=130, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
