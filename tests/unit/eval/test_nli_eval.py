"""Metrics (NLICV Tables 1-3 shape) and the ``eval nli`` command on FakeNLI / FakeJudge."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from reward_server.backends.fake import FakeJudge
from reward_server.backends.settings import JudgeSettings
from reward_server.domain import Regime, Verification
from reward_server.eval.classic import METRICS
from reward_server.eval.common import EXAMPLES
from reward_server.eval.nli import read_items, register, run_nli_eval
from reward_server.nli.metrics import summarize

P, G, S, F = Regime.PERSONALIZATION, Regime.GENERALIZATION, Regime.SYCOPHANCY, Regime.FAILURE


def _v(sc: float, sa: float, regime: Regime) -> Verification:
    return Verification(s_correct=sc, s_aligned=sa, regime=regime, truncated=False)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="cmd"))
    return parser.parse_args(["nli", *argv])


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
    assert (s.n_items, s.n_labelled, s.items_per_s, s.unanswered) == (5, 4, 2.5, 0)


def test_summarize_counts_unanswered_as_wrong() -> None:
    s = summarize([P, P, G, None], [_v(0.9, 0.8, P), None, None, None], seconds=1.0)
    by = {r.regime: r for r in s.per_regime}
    assert (by[P].n, by[P].accuracy, by[P].unanswered, by[P].mean_s_correct) == (2, 0.5, 1, 0.9)
    assert (by[G].accuracy, by[G].unanswered) == (0.0, 1) and math.isnan(by[G].mean_s_correct)
    assert s.mean_acc == pytest.approx(0.25) and s.unanswered == 3 and s.confusion[1] == (0, 0, 0, 0)
    assert sum(s.predicted.values()) == 1


def test_read_items_rejects_bad_lines(tmp_path: Path) -> None:
    f = tmp_path / "x.jsonl"
    f.write_text('{"response": "a", "answer": "b", "preference": "c", "regime": "nope"}\n')
    with pytest.raises(ValueError, match=r"x.jsonl:1"):
        read_items(f)


def test_eval_nli_command(tmp_path: Path) -> None:
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
    out = tmp_path / "out"
    # the judge answers "correct, not aligned" to everything: all generalization
    args = parse(["--input", str(inp), "--out", str(out), "--no-progress", "--evidence",
                  "--set", "engines.nli.kind=fake", "--set", "engines.judge.kind=fake", "--chunk", "2"])  # fmt: skip

    def judge(settings: JudgeSettings) -> FakeJudge:
        return FakeJudge(scripted=['Both checked. {"correct": 0.9, "aligned": 0.2}'])

    report = run_nli_eval(args, judge_factory=judge)
    summary = json.loads((out / "nli_eval.json").read_text())
    assert summary["mean_acc"] == pytest.approx(0.75)
    assert summary["n_items"] == 5 and summary["n_labelled"] == 4
    assert summary["confusion"]["gold_x_predicted"][3] == [0, 1, 0, 0]
    assert summary["model_id"] == "fake-nli"
    j = summary["llm_judge"]
    assert j["model_id"] == "fake-judge" and j["template_version"] == "nlicv-judge-v1"
    assert j["mean_acc"] == pytest.approx(0.25) and j["predicted"]["generalization"] == 5
    assert j["invalid"] == {"unparsable": 0, "out_of_range": 0}
    assert [c["method"] for c in summary["cost"]] == ["NLI verifier (regimes)", "LLM-as-judge (JSON)"]
    assert all(c["items"] == 5 and c["s_per_item"] > 0 for c in summary["cost"])
    lines = [json.loads(x) for x in (out / "nli_samples.jsonl").read_text().splitlines()]
    assert [x["regime"] for x in lines] == [
        "personalization", "generalization", "sycophancy", "generalization", "failure"
    ]  # fmt: skip
    assert lines[4]["id"] == "5" and lines[0]["evidence"][0]["critical_premise"] == [0]
    assert lines[0]["judge"] == {"s_correct": 0.9, "s_aligned": 0.2, "status": "ok", "regime": "generalization",
                                 "answer": 'Both checked. {"correct": 0.9, "aligned": 0.2}'}  # fmt: skip
    assert (out / "nli_confusion.png").stat().st_size > 1000 and not (out / "nli_robustness.png").exists()
    table = report
    assert "NLI verifier fake-nli" in table and "LLM-as-judge fake-judge" in table and "75.00" in table


def test_shipped_example_every_column(tmp_path: Path) -> None:
    ex = EXAMPLES / "nli"
    out = tmp_path / "out"
    args = parse(["--input", str(ex / "items.jsonl"), "--pairs", str(ex / "pairs.jsonl"), "--out", str(out),
                  "--fake", "--no-progress", "--rates", "0,0.5,1"])  # fmt: skip
    report = run_nli_eval(args)
    doc = json.loads((out / "nli_eval.json").read_text())
    assert doc["n_labelled"] == 40 and {r["regime"] for r in doc["per_regime"]} == {r.value for r in Regime}
    j = doc["llm_judge"]  # the fake judge's answers are rubric JSON, never a verdict: all counted wrong
    assert j["invalid"]["unparsable"] == 40 and j["mean_acc"] == 0.0 and j["unanswered"] == 40
    rob = doc["robustness"]
    assert (rob["n_positive"], rob["n_negative"], rob["rates"]) == (10, 10, [0.0, 0.5, 1.0])
    methods = set(rob["rows"][0]["methods"])
    assert methods | set(rob["missing"]) == {"nli", *METRICS}
    for row in rob["rows"]:
        assert all(set(row["methods"][m]) == {"pos", "neg", "acc"} for m in methods)
    assert rob["rows"][0]["replaced_share"] == 0 and rob["rows"][2]["replaced_share"] > 0
    assert set(rob["std"]) == set(rob["mean"]) == methods
    costs = {c["method"] for c in doc["cost"]}
    assert costs >= {"NLI verifier (regimes)", "LLM-as-judge (JSON)", "NLI verifier (pairs)"}
    table = report
    assert "Table 1 shape" in table and "Table 3 shape" in table and "Cost per item" in table
    assert (out / "nli_robustness.png").is_file() and (out / "nli_confusion.png").is_file()


def test_nothing_to_do_and_missing_judge(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nothing to evaluate: give --input"):
        run_nli_eval(parse(["--out", str(tmp_path), "--fake"]))
    ex = EXAMPLES / "nli"
    args = parse(["--input", str(ex / "items.jsonl"), "--out", str(tmp_path / "o"), "--set", "engines.nli.kind=fake",
                  "--no-progress", "--no-plot"])  # fmt: skip
    report = run_nli_eval(args)
    doc = json.loads((tmp_path / "o" / "nli_eval.json").read_text())
    assert doc["llm_judge"] == {"missing": "engines.judge is not set (set it, or use --fake)"}
    assert "LLM-as-judge: not run" in report


def test_outputs_follow_one_scheme_and_old_names_are_found(tmp_path: Path) -> None:
    from reward_server.eval.common import old_outputs, output

    assert output(tmp_path, "nli", "eval.json") == tmp_path / "nli_eval.json"
    assert output(tmp_path, "parl", "samples.jsonl") == tmp_path / "parl_samples.jsonl"
    assert old_outputs(tmp_path, "nli") == []
    (tmp_path / "summary.json").write_text("{}")
    (tmp_path / "confusion.png").write_bytes(b"")
    assert old_outputs(tmp_path, "nli") == [tmp_path / "summary.json", tmp_path / "confusion.png"]
    assert old_outputs(tmp_path, "parl") == []
