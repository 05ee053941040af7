"""Metrics (NLICV Table 3 shape) and the ``eval nli`` command on FakeNLI."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from reward_server.domain import Regime, Verification
from reward_server.eval.nli import read_items, register
from reward_server.nli.metrics import format_table, summarize

P, G, S, F = Regime.PERSONALIZATION, Regime.GENERALIZATION, Regime.SYCOPHANCY, Regime.FAILURE


def _v(sc: float, sa: float, regime: Regime) -> Verification:
    return Verification(s_correct=sc, s_aligned=sa, regime=regime, truncated=False)


def test_summarize_by_hand() -> None:
    gold = [P, P, G, S, None]
    res = [_v(0.9, 0.8, P), _v(0.9, 0.1, G), _v(0.7, 0.2, G), _v(0.1, 0.2, F), _v(0.6, 0.6, P)]
    s = summarize(gold, res, seconds=2.0)
    by = {r.regime: r for r in s.per_regime}
    assert set(by) == {P, G, S}  # no failure-labelled item
    assert by[P].n == 2 and by[P].accuracy == 0.5
    assert by[P].mean_s_correct == pytest.approx(0.9)
    assert by[P].mean_s_aligned == pytest.approx(0.45)
    assert by[P].mean_score == pytest.approx((0.85 + 0.5) / 2)
    assert (by[G].accuracy, by[S].accuracy) == (1.0, 0.0)
    assert s.mean_acc == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert s.confusion[0] == (1, 1, 0, 0)  # gold personalization row
    assert s.confusion[2] == (0, 0, 0, 1)  # gold sycophancy predicted failure
    assert s.predicted == {"personalization": 2, "generalization": 2, "sycophancy": 0, "failure": 1}
    assert (s.n_items, s.n_labelled, s.items_per_s) == (5, 4, 2.5)
    assert "Mean Acc: 50.00%" in format_table(s)


def test_read_items_rejects_bad_lines(tmp_path: Path) -> None:
    f = tmp_path / "x.jsonl"
    f.write_text('{"response": "a", "answer": "b", "preference": "c", "regime": "nope"}\n')
    with pytest.raises(ValueError, match=r"x.jsonl:1"):
        read_items(f)


def test_eval_nli_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    response = "Paris is the capital of France. Museums line the river."
    rows = [
        {"id": "p", "response": response, "answer": "Paris", "preference": "museums",
         "regime": "personalization"},
        {"id": "g", "response": response, "answer": "Paris", "preference": "football",
         "regime": "generalization"},
        {"id": "s", "response": response, "answer": "Berlin", "preference": "museums",
         "regime": "sycophancy"},
        {"id": "f", "response": response, "answer": "Paris", "preference": "opera",
         "regime": "failure"},  # predicted generalization: failure accuracy 0
        {"response": response, "answer": "Rome", "preference": "cats"},  # unlabelled
    ]  # fmt: skip
    inp = tmp_path / "items.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="cmd"))
    out = tmp_path / "out"
    args = parser.parse_args(
        ["nli", "--input", str(inp), "--out", str(out), "--no-progress", "--evidence",
         "--set", "engines.nli.kind=fake", "--chunk", "2"]
    )  # fmt: skip
    assert args.fn(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mean_acc"] == pytest.approx(0.75)
    assert summary["n_items"] == 5 and summary["n_labelled"] == 4
    assert summary["confusion"]["gold_x_predicted"][3] == [0, 1, 0, 0]
    assert summary["model_id"] == "fake-nli"
    lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert [x["regime"] for x in lines] == [
        "personalization", "generalization", "sycophancy", "generalization", "failure"
    ]  # fmt: skip
    assert lines[4]["id"] == "5" and lines[0]["evidence"][0]["critical_premise"] == [0]
    assert (out / "confusion.png").stat().st_size > 1000
    assert "Mean Acc: 75.00%" in capsys.readouterr().out
