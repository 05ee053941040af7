"""``eval nli`` results: tables in the shapes of NLICV Tables 1-3 and plots, from the JSON only.

``summary.json`` holds the verifier's confusion summary at its top level (``mean_acc``,
``per_regime``, ``confusion``, ...), the LLM-as-judge's under ``llm_judge``, the robustness
experiment under ``robustness`` and the cost per item under ``cost``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reward_server.eval import plots
from reward_server.eval.classic import LABELS
from reward_server.eval.common import format_cost, num

# Table 3's column order
TABLE3_ORDER = ("generalization", "personalization", "sycophancy", "failure")
CONFUSION_ORDER = ("personalization", "generalization", "sycophancy", "failure")


def evaluators(doc: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(name, confusion summary) of the verifier and the LLM judge, those that ran."""
    out: list[tuple[str, Mapping[str, Any]]] = []
    if "per_regime" in doc:
        out.append((f"NLI verifier {doc['model_id']}", doc))
    judge = doc.get("llm_judge", {})
    if "per_regime" in judge:
        out.append((f"LLM-as-judge {judge['model_id']}", judge))
    return out


def format_table3(doc: Mapping[str, Any]) -> str:
    rows = evaluators(doc)
    if not rows:
        return ""
    width = max(len(n) for n, _ in rows)
    head = f"{'Model':<{width}} {'Items':>5}" + "".join(f" {r:>15} {'':>6}" for r in TABLE3_ORDER)
    head += f" {'Mean':>6} {'Time (s)':>18} {'No':>6}"
    sub = f"{'':<{width}} {'':>5}" + "".join(f" {'Score':>15} {'Acc.':>6}" for _ in TABLE3_ORDER)
    sub += f" {'Acc.':>6} {'Avg.':>8} {'Total':>9} {'answer':>6}"
    lines = ["Table 3 shape: regime detection (Score = mean (S_c+S_a)/2, Acc. in %)", head, sub]
    for name, s in rows:
        by = {r["regime"]: r for r in s["per_regime"]}
        row = f"{name:<{width}} {s['n_items']:>5}"
        for r in TABLE3_ORDER:
            cell = by.get(r, {})
            row += f" {num(cell.get('mean_score'), width=15)} {num(cell.get('accuracy'), scale=100, width=6)}"
        avg = s["seconds"] / s["n_items"] if s["n_items"] else None
        row += f" {num(s['mean_acc'], '.2f', scale=100, width=6)} {num(avg, '.4f', width=8)}"
        row += f" {num(s['seconds'], '.2f', width=9)} {s.get('unanswered', 0):>6}"
        lines.append(row)
    lines.append("Table 2 shape: mean S_c / S_a per gold regime")
    lines.append(f"{'Model':<{width}}" + "".join(f" {r:>15}" for r in TABLE3_ORDER))
    for name, s in rows:
        by = {r["regime"]: r for r in s["per_regime"]}
        cells = [f"{num(by.get(r, {}).get('mean_s_correct'))}/{num(by.get(r, {}).get('mean_s_aligned'))}"
                 for r in TABLE3_ORDER]  # fmt: skip
        lines.append(f"{name:<{width}}" + "".join(f" {c:>15}" for c in cells))
    judge = doc.get("llm_judge", {})
    if "missing" in judge:
        lines.append(f"LLM-as-judge: not run ({judge['missing']})")
    elif judge:
        inv = judge.get("invalid", {})
        lines.append(f"LLM-as-judge template {judge.get('template_version')}: {inv.get('unparsable', 0)} "
                     f"unparsable and {inv.get('out_of_range', 0)} out-of-range answers (counted wrong)")  # fmt: skip
    return "\n".join(lines)


def _method_label(doc: Mapping[str, Any], m: str) -> str:
    return f"NLI {doc['robustness']['nli_model']}" if m == "nli" else LABELS.get(m, m)


def format_table1(doc: Mapping[str, Any]) -> str:
    rob = doc.get("robustness")
    if not rob:
        return ""
    methods = list(rob["rows"][0]["methods"])
    labels = [_method_label(doc, m) for m in methods]
    w = [max(20, len(label)) for label in labels]
    lines = [
        f"Table 1 shape: {rob['n_positive']} positive / {rob['n_negative']} negative pairs, synonym "
        f"perturbation of the responses (seed {rob['seed']}); Pos/Neg = mean score, Acc. in %",
        f"{'Rate':>6} {'replaced':>8}" + "".join(f" {label:^{k}}" for label, k in zip(labels, w, strict=True)),
        f"{'':>6} {'words':>8}" + "".join(f" {'Pos':>{k - 14}} {'Neg':>6} {'Acc.':>6}" for k in w),
    ]

    def cells(by: Mapping[str, Mapping[str, float]]) -> str:
        return "".join(
            f" {num(by[m]['pos'], width=k - 14)} {num(by[m]['neg'], width=6)} {num(by[m]['acc'], scale=100, width=6)}"
            for m, k in zip(methods, w, strict=True)
        )

    for row in rob["rows"]:
        lines.append(f"{row['rate']:>6.2f} {num(row.get('replaced_share'), '.0%', width=8)}" + cells(row["methods"]))
    lines.append(f"{'Std':>6} {'':>8}" + cells(rob["std"]))
    lines.append(f"{'Mean':>6} {'':>8}" + cells(rob["mean"]))
    for m in methods:
        d = rob["decision"][m]
        lines.append(f"  {_method_label(doc, m)}: positive iff score > {d['threshold']:.4g} ({d['rule']})")
    for k, why in rob.get("missing", {}).items():
        lines.append(f"  {LABELS.get(k, k)}: not computed ({why})")
    return "\n".join(lines)


def format_all(doc: Mapping[str, Any]) -> str:
    parts = [format_table3(doc), format_table1(doc)]
    if doc.get("cost"):
        parts.append("Cost per item\n" + format_cost(doc["cost"]))
    return "\n\n".join(p for p in parts if p)


def write_confusion(doc: Mapping[str, Any], path: Path) -> bool:
    """Heatmaps gold x predicted (+ a 'no answer' column) of each evaluator, side by side."""
    rows = evaluators(doc)
    plt = plots.pyplot() if rows else None
    if plt is None:
        return False
    fig, axes = plt.subplots(1, len(rows), figsize=(6.2 * len(rows), 4.8), squeeze=False)
    cols = [*CONFUSION_ORDER, "no answer"]
    for ax, (name, s) in zip(axes[0], rows, strict=True):
        by = {r["regime"]: r for r in s["per_regime"]}
        grid = [[*list(row), by.get(g, {}).get("unanswered", 0)]
                for g, row in zip(CONFUSION_ORDER, s["confusion"]["gold_x_predicted"], strict=True)]  # fmt: skip
        ax.imshow(grid, cmap="Blues", vmin=0)
        ax.axvline(len(CONFUSION_ORDER) - 0.5, color="black", linewidth=1.5)  # regimes | no answer
        ax.set_xticks(range(len(cols)), cols, rotation=30, ha="right")
        ax.set_yticks(range(4), CONFUSION_ORDER)
        ax.set_xlabel("predicted regime")
        ax.set_ylabel("gold regime")
        top = max(max(r) for r in grid) or 1
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                ax.text(j, i, str(v), ha="center", va="center", color="white" if v > top / 2 else "black")
        ax.set_title(f"{name}\nMean Acc {num(s['mean_acc'], '.1f', scale=100)}%", fontsize=9)
    plots.save(fig, path)
    return True


def write_robustness(doc: Mapping[str, Any], path: Path) -> bool:
    """Accuracy per rate and method (grouped bars, labelled)."""
    rob = doc.get("robustness")
    plt = plots.pyplot() if rob else None
    if plt is None or rob is None:
        return False
    methods = list(rob["rows"][0]["methods"])
    groups = [f"rate {row['rate']:.1f}" for row in rob["rows"]] + ["mean"]
    series: dict[str, list[float | None]] = {
        _method_label(doc, m): [100 * row["methods"][m]["acc"] for row in rob["rows"]] + [100 * rob["mean"][m]["acc"]]
        for m in methods
    }
    fig, ax = plt.subplots(figsize=(max(8.0, 1.9 * len(groups)), 4.8))
    plots.grouped_bars(ax, groups, series, ylabel="accuracy (%)",
                       title=f"Accuracy under synonym perturbation ({rob['n_positive']} pos / "
                       f"{rob['n_negative']} neg pairs, seed {rob['seed']})")  # fmt: skip
    plots.save(fig, path)
    return True
