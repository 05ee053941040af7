"""``eval parl`` end to end on the FakeJudge (engines.judge.kind=fake), values computed by hand,
and on the shipped example (every column)."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from reward_server import cli
from reward_server.backends.base import GenerationRequest
from reward_server.backends.fake import FakeJudge
from reward_server.backends.settings import JudgeSettings
from reward_server.eval.classic import LABELS, METRICS
from reward_server.eval.common import EXAMPLES
from reward_server.eval.parl import register, run_parl_eval

RA = 'The text uses the word "alpha".'
RB = 'The text uses the word "beta".'


class HolisticFake(FakeJudge):
    """FakeJudge whose sampled answer is looked up by the text the holistic prompt rates."""

    def __init__(self, answers: dict[str, str]) -> None:
        super().__init__()
        self.answers = answers

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[str]:
        out = []
        for r in requests:
            m = re.search(r"to rate\n(.*?)\n\nHow well", r.user, re.S)
            out.append(self.answers.get(m.group(1) if m else "", "junk"))
        return out


def write(path: Path, rows: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["parl", *argv])


def test_eval_parl_table(tmp_path: Path) -> None:
    write(tmp_path / "R.jsonl", [
        {"user_id": "u1", "rules": [RA, RB], "task": "amazon"},
        {"user_id": "u2", "rules": [RA]},
        {"user_id": "u3", "rules": []},
    ])  # fmt: skip
    history = [{"context": "c", "text": "alpha beta"}]
    write(tmp_path / "H.jsonl", [{"user_id": u, "history": history} for u in ("u1", "u2", "u3")])
    pred = tmp_path / "pred"
    pred.mkdir()
    write(pred / "gt.jsonl", [
        {"user_id": "u1", "text": "alpha beta"},  # both rules: user-level 1, rubric 2/2
        {"user_id": "u2", "text": "alpha", "context": "c"},  # 1, 1/1
        {"user_id": "u3", "text": "anything"},  # no rules: excluded (the LLM judge answers junk)
    ])  # fmt: skip
    write(pred / "rag.jsonl", [
        {"user_id": "u1", "text": "alpha only"},  # 0, 1/2
        {"user_id": "u2", "text": "alpha"},  # 1, 1/1
        {"user_id": "u3", "text": "x"},  # the LLM judge answers 9: out of range
    ])  # fmt: skip
    write(pred / "sft.jsonl", [{"user_id": "u1", "text": "nothing"}, {"user_id": "u2", "text": "nope"}])
    answers = {"alpha beta": "5", "alpha": "Score: 4", "alpha only": "3", "x": "9"}  # anything else: junk

    def factory(settings: JudgeSettings) -> FakeJudge:
        return HolisticFake(answers)

    out = tmp_path / "out"
    args = parse(["--rubrics", str(tmp_path / "R.jsonl"), "--predictions", str(pred), "--out", str(out),
                  "--history", str(tmp_path / "H.jsonl"), "--set", "engines.judge.kind=fake", "--no-progress",
                  "--metrics", "rouge1,bleu"])  # fmt: skip
    report = run_parl_eval(args, judge_factory=factory)
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
    # gt (5, 4, junk) -> (1 + 0.75) / 2; rag (3, 4, 9) -> (0.5 + 0.75) / 2
    assert gt["llm_judge"] == {"normalized": pytest.approx(0.875), "mean_score": 4.5, "parsed": 2,
                               "out_of_range": 0, "unparsable": 1, "skipped_no_history": 0}  # fmt: skip
    assert rag["llm_judge"]["normalized"] == pytest.approx(0.625) and rag["llm_judge"]["out_of_range"] == 1
    assert sft["llm_judge"]["parsed"] == 0 and sft["llm_judge"]["unparsable"] == 2
    assert sft["llm_judge"]["normalized"] is None
    mdj = res["max_diff_llm_judge"]
    assert mdj["best_method"] == "rag" and mdj["value"] == pytest.approx(0.25) and mdj["n_pairs"] == 2
    # classic metrics against gt, ROUGE-1 F per pair: "alpha only"/"alpha beta" 1/2, "alpha" 1, "x" 0
    assert rag["classic"]["rouge1"] == pytest.approx((0.5 + 1.0 + 0.0) / 3) and rag["classic"]["n_pairs"] == 3
    assert sft["classic"]["rouge1"] == 0.0 and "classic" not in gt
    assert res["classic"]["computed"] == ["rouge1", "bleu"]
    assert res["template_versions"]["rubric.judge"] == "parl-released" and res["judge_model"] == "fake-judge"
    assert res["template_versions"]["rubric.holistic"] == "parl-holistic-v1"
    costs = {c["method"]: c for c in res["cost"]}
    assert costs["rubric judge (p_yes)"]["items"] == 8 and costs["LLM-as-judge (1-5)"]["items"] == 8
    assert costs["rouge1"]["items"] == 5 and costs["bleu"]["s_per_item"] > 0
    assert (out / "parl_eval.png").stat().st_size > 10_000
    samples = [json.loads(x) for x in (out / "parl_samples.jsonl").read_text().splitlines()]
    rag_u3 = next(r for r in samples if (r["method"], r["user_id"]) == ("rag", "u3"))
    assert rag_u3["p_yes"] == [] and rag_u3["llm_judge"] == {"score": None, "status": "out_of_range", "answer": "9"}
    assert rag_u3["classic"]["rouge1"] == 0.0 and len(samples) == 8
    table = report
    assert "gt (GT)" in table and "Max-Diff (rubrics, user-level): 50.00 pts vs rag" in table
    assert "unparsable/out-of-range answers: gt 1/0, rag 0/1, sft 2/0" in table
    assert "Cost per item" in table


def test_shipped_example_every_column(tmp_path: Path) -> None:
    ex = EXAMPLES / "parl"
    out = tmp_path / "out"
    args = parse(["--rubrics", str(ex / "rubrics.jsonl"), "--predictions", str(ex / "predictions"),
                  "--history", str(ex / "history.jsonl"), "--out", str(out), "--fake", "--no-progress"])  # fmt: skip
    report = run_parl_eval(args)
    res = json.loads((out / "parl_eval.json").read_text())
    assert set(res["methods"]) == {"gt", "Non", "RAG", "SFT", "GRPO", "SFT+GRPO"}
    computed = set(res["classic"]["computed"])
    assert computed | set(res["classic"]["missing"]) == set(METRICS)  # each metric computed or explained
    for name, m in res["methods"].items():
        assert m["n_samples"] == 9 and m["user_level_accuracy"] is not None
        assert m["llm_judge"]["parsed"] + m["llm_judge"]["unparsable"] + m["llm_judge"]["out_of_range"] == 9
        if name != "gt":
            assert all(m["classic"][k] is not None for k in computed)
    assert res["max_diff"]["best_method"] in res["methods"] and "llm_judge" in res
    assert {c["method"] for c in res["cost"]} == {"rubric judge (p_yes)", "LLM-as-judge (1-5)", *computed}
    table = report
    assert all(LABELS[k] in table for k in METRICS) and "LLM-judge" in table
    assert (out / "parl_eval.png").is_file()


def test_missing_gt_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Through the command line: one line naming the folder and the fix, exit code 2."""
    write(tmp_path / "R.jsonl", [{"user_id": "u1", "rules": [RA]}])
    (tmp_path / "p").mkdir()
    write(tmp_path / "p" / "rag.jsonl", [{"user_id": "u1", "text": "alpha"}])
    argv = ["eval", "parl", "--rubrics", str(tmp_path / "R.jsonl"), "--predictions", str(tmp_path / "p"),
            "--out", str(tmp_path / "o"), "--set", "engines.judge.kind=fake", "--no-progress"]  # fmt: skip
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {tmp_path / 'p'} has no gt.jsonl (the ground truth; --gt names it)"
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("cleaning", "gt_level"), [("released", 0.0), ("none", 1.0)])
def test_eval_parl_cleans_predictions_as_released(tmp_path: Path, cleaning: str, gt_level: float) -> None:
    """PARL's eval-test.py runs postprocess_output on every method's text (the ground truth's
    too) before judging: a thinking block and a "[Review]:" prefix are cut. none (before issue
    52): as written. Here the rule's word is only in what is cut."""
    write(tmp_path / "R.jsonl", [{"user_id": "u1", "rules": [RA]}])
    pred = tmp_path / "pred"
    pred.mkdir()
    write(pred / "gt.jsonl", [{"user_id": "u1", "text": "<think>alpha?</think> [Review]: plain beta"}])
    write(pred / "rag.jsonl", [{"user_id": "u1", "text": "Review: alpha [Review]: beta"}])
    out = tmp_path / "out"
    args = parse(["--rubrics", str(tmp_path / "R.jsonl"), "--predictions", str(pred), "--out", str(out),
                  "--set", "engines.judge.kind=fake", "--set", f"rubric.text_cleaning={cleaning}",
                  "--no-progress", "--no-llm-judge", "--metrics", "rouge1"])  # fmt: skip
    run_parl_eval(args)
    res = json.loads((out / "parl_eval.json").read_text())
    assert res["methods"]["gt"]["user_level_accuracy"] == gt_level
    assert res["methods"]["rag"]["user_level_accuracy"] == gt_level
    assert res["template_versions"]["rubric.text_cleaning"] == cleaning
    samples = [json.loads(line) for line in (out / "parl_samples.jsonl").read_text().splitlines()]
    assert {s["method"]: s["p_yes"] for s in samples}["gt"] == [0.02 if cleaning == "released" else 0.98]
