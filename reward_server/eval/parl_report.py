"""``eval parl`` results: the JSON document (source of truth), its table and its plot.

Shapes: PARL Table 1 (user-level accuracy per method, GT first, Max-Diff with its t-test,
coverage), the rubric-level accuracy of App. G.5, the LLM-as-judge of §5.4.1 and the classic
metrics of App. G.6 (each method against the ground truth), plus the cost per item of each
evaluator. The table and the plot read only the JSON (:func:`format_table`, :func:`plot`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from reward_server.eval import plots
from reward_server.eval.classic import LABELS, METRICS
from reward_server.eval.common import format_cost, num
from reward_server.eval.parl_io import UserRubric
from reward_server.rubric import metrics
from reward_server.rubric.holistic import HolisticScore

Key = tuple[str, str]


def _max_diff(gt_table: Mapping[Key, float], tables: Mapping[str, Mapping[Key, float]]) -> dict[str, Any] | None:
    """GT mean minus the best other method's, paired t-test over the keys both have."""
    means = {m: sum(t.values()) / len(t) for m, t in tables.items() if t}
    if not gt_table or not means:
        return None
    gt_mean = sum(gt_table.values()) / len(gt_table)
    diff, best = metrics.max_diff(gt_mean, means)
    keys = [k for k in gt_table if k in tables[best]]
    p = metrics.paired_t_test_p([gt_table[k] for k in keys], [tables[best][k] for k in keys])
    return {"value": diff, "best_method": best, "p_value": p, "significant": bool(p < 0.05), "n_pairs": len(keys)}


def _holistic_summary(scores: Mapping[Key, HolisticScore], n_samples: int) -> dict[str, Any]:
    valid = [s.score for s in scores.values() if s.score is not None]
    return {
        "normalized": metrics.llm_judge_normalized([float(v) for v in valid]),
        "mean_score": sum(valid) / len(valid) if valid else math.nan,
        "parsed": len(valid),
        "out_of_range": sum(1 for s in scores.values() if s.status == "out_of_range"),
        "unparsable": sum(1 for s in scores.values() if s.status == "unparsable"),
        "skipped_no_history": n_samples - len(scores),
    }


def summarize(
    judged: Mapping[str, Mapping[Key, Sequence[float]]],
    rubrics: Mapping[str, UserRubric],
    *,
    gt: str,
    threshold: float,
    inclusive: bool = False,
    holistic: Mapping[str, Mapping[Key, HolisticScore]] | None = None,
    classic: Mapping[str, Mapping[str, Mapping[Key, float]]] | None = None,
) -> dict[str, Any]:
    """Every metric of docs/parl.md §5 and the baselines, from judged samples per method.

    ``holistic``: method -> sample -> parsed 1-5 answer (None: no LLM judge was run);
    ``classic``: non-GT method -> metric -> sample -> score against the GT text;
    ``inclusive``: a rule at exactly ``threshold`` is satisfied (``rubric.threshold_rule=ge``).
    """
    rule_sets = {u: r.rules for u, r in rubrics.items()}
    methods: dict[str, dict[str, Any]] = {}
    for name, table in judged.items():
        rows = list(table.values())
        rla = metrics.rubric_level_accuracy(rows, threshold, inclusive=inclusive)
        m: dict[str, Any] = {
            "n_samples": len(rows),
            "n_scored": sum(1 for r in rows if r),
            "user_level_accuracy": metrics.user_level_accuracy(rows, threshold, inclusive=inclusive),
            "rubric_level_pooled": rla.pooled,
            "rubric_level_per_sample": rla.per_sample_mean,
        }
        if holistic is not None:
            m["llm_judge"] = _holistic_summary(holistic.get(name, {}), len(rows))
        if classic is not None and name != gt:
            scores = classic.get(name, {})
            m["classic"] = {k: (sum(v.values()) / len(v) if v else math.nan) for k, v in scores.items()}
            m["classic"]["n_pairs"] = max((len(v) for v in scores.values()), default=0)
        methods[name] = m
    result: dict[str, Any] = {
        "n_users": len(rubrics),
        "coverage_percent": metrics.user_coverage(rule_sets),
        "avg_valid_rules": metrics.average_valid_rules(rule_sets),
        "threshold": threshold,
        "threshold_rule": "ge" if inclusive else "gt",
        "gt": gt,
        "methods": methods,
    }
    if gt in judged:
        per_sample = {
            name: {k: 1.0 if all(metrics.satisfied(v, threshold, inclusive=inclusive)) else 0.0
                   for k, v in table.items() if v}
            for name, table in judged.items()
        }
        md = _max_diff(per_sample[gt], {n: t for n, t in per_sample.items() if n != gt})
        if md is not None:
            result["max_diff"] = md
    if holistic is not None and gt in holistic:
        norm = {
            name: {k: s.normalized for k, s in table.items() if s.normalized is not None}
            for name, table in holistic.items()
        }
        md = _max_diff(norm[gt], {n: t for n, t in norm.items() if n != gt})
        if md is not None:
            result["max_diff_llm_judge"] = md
    return result


def _order(result: Mapping[str, Any]) -> list[str]:
    gt = result["gt"]
    return sorted(result["methods"], key=lambda m: (m != gt, m))


def _md_line(label: str, md: Mapping[str, Any] | None) -> str:
    if not md:
        return f"{label}: n/a"
    star = "*" if md["significant"] else ""
    return (f"{label}: {num(md['value'], '.2f', scale=100)}{star} pts vs {md['best_method']} "
            f"(paired t-test over {md['n_pairs']} samples, p={num(md['p_value'], '.3g')})")  # fmt: skip


def format_table(result: Mapping[str, Any]) -> str:
    """PARL Table 1 / G.5 / G.6 / §5.4.1 side by side (every value x100), then the costs."""
    gt = result["gt"]
    names = _order(result)
    width = max(12, *(len(n) + 5 for n in names))
    classic = result.get("classic", {})
    head = f"{'Method':<{width}} {'User-acc':>8} {'Rub-pool':>8} {'Rub-mean':>8} {'LLM-judge':>9}"
    head += "".join(f" {LABELS[k]:>9}" for k in METRICS) + f" {'Samples':>9}"
    lines = [head]
    for n in names:
        m = result["methods"][n]
        row = f"{(n + ' (GT)' if n == gt else n):<{width}}"
        for key in ("user_level_accuracy", "rubric_level_pooled", "rubric_level_per_sample"):
            row += f" {num(m[key], '.2f', scale=100, width=8)}"
        row += f" {num(m.get('llm_judge', {}).get('normalized'), '.2f', scale=100, width=9)}"
        for k in METRICS:
            cell = "ref" if n == gt else num(m.get("classic", {}).get(k), ".2f", scale=100)
            row += f" {cell:>9}"
        row += f" {str(m['n_scored']) + '/' + str(m['n_samples']):>9}"
        lines.append(row)
    lines.append(f"Coverage: {num(result['coverage_percent'], '.1f')}%   "
                 f"Avg valid rules/user: {num(result['avg_valid_rules'], '.2f')}   "
                 f"threshold p_yes {'>=' if result.get('threshold_rule') == 'ge' else '>'} "
                 f"{result['threshold']}")  # fmt: skip
    lines.append(_md_line("Max-Diff (rubrics, user-level)", result.get("max_diff")))
    judge = result.get("llm_judge", {})
    if "missing" in judge:
        lines.append(f"LLM-as-judge: not run ({judge['missing']})")
    else:
        lines.append(_md_line("Max-Diff (LLM-as-judge)", result.get("max_diff_llm_judge")))
        counts = {n: result["methods"][n].get("llm_judge", {}) for n in names}
        bad = ", ".join(f"{n} {c['unparsable']}/{c['out_of_range']}"
                        for n, c in counts.items() if c.get("unparsable") or c.get("out_of_range"))  # fmt: skip
        lines.append(f"LLM-as-judge: {judge.get('model')} ({judge.get('template_version')}), 1-5 -> (s-1)/4 over "
                     f"valid answers; unparsable/out-of-range answers: {bad or 'none'}")  # fmt: skip
    for k, why in classic.get("missing", {}).items():
        lines.append(f"{LABELS.get(k, k)}: not computed ({why})")
    if classic:
        lines.append(f"Classic metrics against {gt}; BERTScore {classic.get('bertscore_model')}, "
                     f"EmbScore {classic.get('embedding_model')}")  # fmt: skip
    lines.append(f"Rubric judge: {result.get('judge_model')}  templates: {result.get('template_versions')}")
    if result.get("cost"):
        lines += ["", "Cost per item", format_cost(result["cost"])]
    return "\n".join(lines)


def plot(result: Mapping[str, Any], path: Path) -> bool:
    """Left: user-level accuracy (rubrics) and LLM-as-judge per method; right: classic metrics."""
    plt = plots.pyplot()
    if plt is None:
        return False
    names = _order(result)
    ms = [result["methods"][n] for n in names]
    pct = [100 * m["user_level_accuracy"] if m["user_level_accuracy"] is not None else None for m in ms]
    series: dict[str, list[float | None]] = {f"user-level acc. (rubrics; judge {result.get('judge_model')})": pct}
    judge = result.get("llm_judge", {})
    if "missing" not in judge and judge:
        vals = [m.get("llm_judge", {}).get("normalized") for m in ms]
        series[f"LLM-as-judge (s-1)/4 ({judge.get('model')})"] = [None if v is None else 100 * v for v in vals]
    others = [n for n in names if n != result["gt"]]
    computed = [k for k in result.get("classic", {}).get("computed", [])]
    fig, axes = plt.subplots(1, 2 if computed else 1, figsize=(13 if computed else 7, 4.6), squeeze=False)
    labels = [n + " (GT)" if n == result["gt"] else n for n in names]
    plots.grouped_bars(axes[0][0], labels, series, ylabel="score x100",
                       title="PARL: rubric user-level accuracy vs LLM-as-judge")  # fmt: skip
    if computed:
        cs: dict[str, list[float | None]] = {}
        for k in computed:
            vals = [result["methods"][n].get("classic", {}).get(k) for n in others]
            cs[LABELS[k]] = [None if v is None else 100 * v for v in vals]
        plots.grouped_bars(axes[0][1], others, cs, ylabel="score x100",
                           title=f"Classic metrics against {result['gt']} (PARL App. G.6)")  # fmt: skip
    plots.save(fig, path)
    return True
