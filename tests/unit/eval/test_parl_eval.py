"""``eval parl`` end to end on the FakeJudge (engines.judge.kind=fake), values computed by hand."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from reward_server.eval.parl import register, run_parl_eval

RA = 'The text uses the word "alpha".'
RB = 'The text uses the word "beta".'


def write(path: Path, rows: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def test_eval_parl_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path / "R.jsonl", [
        {"user_id": "u1", "rules": [RA, RB], "task": "amazon"},
        {"user_id": "u2", "rules": [RA]},
        {"user_id": "u3", "rules": []},
    ])  # fmt: skip
    pred = tmp_path / "pred"
    pred.mkdir()
    write(pred / "gt.jsonl", [
        {"user_id": "u1", "text": "alpha beta"},  # both rules: user-level 1, rubric 2/2
        {"user_id": "u2", "text": "alpha", "context": "c"},  # 1, 1/1
        {"user_id": "u3", "text": "anything"},  # no rules: excluded
    ])  # fmt: skip
    write(pred / "rag.jsonl", [
        {"user_id": "u1", "text": "alpha only"},  # 0, 1/2
        {"user_id": "u2", "text": "alpha"},  # 1, 1/1
        {"user_id": "u3", "text": "x"},
    ])  # fmt: skip
    write(pred / "sft.jsonl", [{"user_id": "u1", "text": "nothing"}, {"user_id": "u2", "text": "nope"}])
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    out = tmp_path / "out"
    args = parser.parse_args([
        "parl", "--rubrics", str(tmp_path / "R.jsonl"), "--predictions", str(pred), "--out", str(out),
        "--set", "engines.judge.kind=fake", "--no-progress",
    ])  # fmt: skip
    assert run_parl_eval(args) == 0
    res = json.loads((out / "parl_eval.json").read_text())
    assert res["coverage_percent"] == pytest.approx(200 / 3) and res["avg_valid_rules"] == 1.0
    gt, rag, sft = (res["methods"][m] for m in ("gt", "rag", "sft"))
    assert gt["user_level_accuracy"] == 1.0 and gt["n_scored"] == 2 and gt["n_samples"] == 3
    assert rag["user_level_accuracy"] == 0.5
    assert rag["rubric_level_pooled"] == pytest.approx(2 / 3)
    assert rag["rubric_level_per_sample"] == pytest.approx(0.75)
    assert sft["user_level_accuracy"] == 0.0
    md = res["max_diff"]
    assert md["best_method"] == "rag" and md["value"] == pytest.approx(0.5)
    assert md["p_value"] == pytest.approx(0.5)  # diffs (1, 0): t = 1 with 1 df -> p = 0.5
    assert res["template_versions"]["rubric.judge"] == "parl-v1" and res["judge_model"] == "fake-judge"
    assert (out / "parl_eval.png").stat().st_size > 0
    table = capsys.readouterr().out
    assert "gt (GT)" in table and "Max-Diff: 50.00 pts vs rag" in table


def test_missing_gt_is_an_error(tmp_path: Path) -> None:
    write(tmp_path / "R.jsonl", [{"user_id": "u1", "rules": [RA]}])
    (tmp_path / "p").mkdir()
    write(tmp_path / "p" / "rag.jsonl", [{"user_id": "u1", "text": "alpha"}])
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["parl", "--rubrics", str(tmp_path / "R.jsonl"), "--predictions",
                              str(tmp_path / "p"), "--out", str(tmp_path / "o"), "--set", "engines.judge.kind=fake",
                              "--no-progress"])  # fmt: skip
    assert run_parl_eval(args) == 2
