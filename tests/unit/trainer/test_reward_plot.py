"""The run's reward plot, rendered (matplotlib Agg) from small run logs of both engines' shapes:
integer step ticks, the reward's components drawn, the reward kind and models in the title."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("pyarrow")

from reward_server.api.rows import extra_info
from reward_server.domain import NliConstraintsSpec, RubricScoreSpec
from trainer.run_log import data_kinds, plot_rewards, plot_title, reward_figure, reward_rows

PROVENANCE = {"judge_model": "smollm2-local", "nli_model": "judge-as-nli:smollm2-local"}


def trl_row(step: int, reward: float) -> dict[str, Any]:
    """A row as TRL's log (via our callback) writes it: components under reward/."""
    return {"step": step, "loss": 0.01, "reward": reward, "reward_std": 0.05,
            "rewards/reward_server/mean": reward, "reward/mean_p_yes": reward,
            "reward/fraction_satisfied": reward / 2, "reward/all_satisfied": 0.25,
            "reward/n_rules": 3.0 + step, "reward/policy_invalid": 0.0, "reward/wait_s": 2.4,
            "reward/masked": 0.0, "epoch": step / 9}


def write_log(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def rendered(png: Path, log: Path, title: str) -> Any:
    """Save the plot as the runs do, and hand back the same figure to inspect what was drawn."""
    assert plot_rewards(log, png, title=title) == png
    assert png.stat().st_size > 0
    return reward_figure(reward_rows(log), title=title)


def integer_ticks(ax: Any) -> list[float]:
    ticks = [float(t) for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(t == int(t) for t in ticks), ticks
    return ticks


def test_trl_log_plot_has_integer_steps_components_kind_and_models(
    tmp_path: Path,
) -> None:
    log = write_log(tmp_path / "run_log.jsonl", [trl_row(1, 0.47), trl_row(2, 0.32), trl_row(3, 0.36)])
    (tmp_path / "provenance.json").write_text(json.dumps(PROVENANCE))
    title = plot_title("TRL", kinds=["rubric_score"], policy="smollm2-local", run_dir=tmp_path)
    fig = rendered(tmp_path / "reward.png", log, title)
    reward_ax, comp_ax = fig.axes[:2]
    assert integer_ticks(comp_ax) == [1.0, 2.0, 3.0]
    drawn = reward_ax.get_title()
    assert "rubric_score" in drawn and "TRL" in drawn
    assert "policy smollm2-local" in drawn and "judge smollm2-local" in drawn
    assert "NLI judge-as-nli:smollm2-local" in drawn
    legend = [t.get_text() for a in fig.axes[1:] for t in a.get_legend().get_texts()]
    # every component, the count in its own panel; the call's wait and the masking flag are not parts
    assert sorted(legend) == ["all_satisfied: constant 0.25", "fraction_satisfied: last 0.18",
                              "mean_p_yes: last 0.36", "n_rules: last 6",
                              "policy_invalid: constant 0"]
    lines = drawn_lines(fig)
    assert list(lines["mean_p_yes"].get_ydata()) == [0.47, 0.32, 0.36]
    assert list(lines["n_rules"].get_ydata()) == [4.0, 5.0, 6.0]
    assert lines["n_rules"].axes is fig.axes[2]  # not on a twin axis over the 0..1 ones


def drawn_lines(fig: Any) -> dict[str, Any]:
    """component name -> the line that draws it (a line drawing several names them all)."""
    out = {}
    for a in fig.axes[1:]:
        for line in a.get_lines():
            for name in line.get_label().split(":", 1)[0].replace("\n", " ").split(" = "):
                out[name.strip()] = line
    return out


def test_components_equal_at_every_step_share_one_labelled_line(tmp_path: Path) -> None:
    rows = [{"step": s, "reward": 0.5, "reward_std": 0.1, "reward/policy_invalid": 0.0,
             "reward/all_satisfied": 0.0, "reward/gamma": 0.0, "reward/mean_p_yes": 0.1 * s,
             "reward/s_target": 0.1 * s} for s in (1, 2, 3)]
    log = write_log(tmp_path / "run_log.jsonl", rows)
    fig = rendered(tmp_path / "reward.png", log, "t")
    comp_ax = fig.axes[1]
    labels = [ln.get_label() for ln in comp_ax.get_lines()]
    assert labels == ["all_satisfied = gamma = policy_invalid: constant 0",
                      "mean_p_yes = s_target: last 0.3"]
    styles = {(ln.get_marker(), ln.get_linestyle()) for ln in comp_ax.get_lines()}
    assert len(styles) == 2  # each line its own marker and dash
    # every legend sits outside its axes' data area (to the right)
    fig.canvas.draw()
    for a in fig.axes:
        legend = a.get_legend()
        assert legend is not None
        box = legend.get_window_extent()
        assert box.x0 >= a.get_window_extent().x1, (box, a.get_window_extent())


def test_one_verl_step_still_gets_an_integer_tick(tmp_path: Path) -> None:
    row = {"step": 1, "data": {"critic/score/mean": 0.6, "reward/s_target": 0.7,
                               "reward/gamma": 1.2, "reward/reward_masked": 0.0}}
    log = write_log(tmp_path / "run_log.jsonl", [row])
    assert reward_rows(log) == [{"step": 1.0, "reward": 0.6, "reward_std": 0.0,
                                 "reward/s_target": 0.7, "reward/gamma": 1.2}]
    title = plot_title("verl (rubric_generator)", kinds=["parl_reward"], policy="Qwen/Qwen3-8B",
                       run_dir=tmp_path)  # no provenance.json: models unknown, said so
    fig = rendered(tmp_path / "reward.png", log, title)
    assert integer_ticks(fig.axes[-1]) == [1.0]
    assert "parl_reward" in fig.axes[0].get_title() and "judge ?" in fig.axes[0].get_title()


def test_reward_kinds_read_from_both_parquet_layouts(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    extras = [extra_info(RubricScoreSpec(context="c", text="", rules=("r",)), user_id="u1", index=0),
              extra_info(NliConstraintsSpec(response="", answer="a", preference="p"), user_id="u2",
                         index=1)]
    pq.write_table(pa.table({"extra_info_json": [json.dumps(e) for e in extras]}), tmp_path / "trl.parquet")
    pq.write_table(pa.table({"extra_info": extras}), tmp_path / "verl.parquet")
    for name in ("trl.parquet", "verl.parquet"):
        assert data_kinds(tmp_path / name) == ["nli_constraints", "rubric_score"]
