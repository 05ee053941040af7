"""The training-row contract (reward_server.api.rows): one writer, one reader, one
fill_response, for verl (dict), TRL (JSON text) and OpenRLHF (the label) alike; old rows refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reward_server import domain as d
from reward_server.api.convert import item_from_proto
from reward_server.api.rows import (
    ExtraInfoError,
    extra_info,
    fill_response,
    read_row,
)
from reward_server.rpc import openrlhf

HISTORY = (d.HistoryItem("Article: a", "Why a? At last"), d.HistoryItem("Article: b", "Why b?"))
RUBRIC = d.RubricScoreSpec(context="Article: c", text="", rules=("r1", "r2"), task=d.Task.NEWS,
                           aggregate=d.RubricAggregate.MEAN_P_YES)
NLI = d.NliConstraintsSpec(response="", answer="Paris", preference="museums",
                           reward_function=d.NliRewardFunction.PRODUCT)
PARL = d.ParlRewardSpec(history=HISTORY, policy_output="", target=HISTORY[0],
                        baselines=("b1", "b2"), variant=d.ParlVariant.PARL_B, task=d.Task.NEWS)
WEIGHTED = d.WeightedSpec(parts=(d.WeightedPart(3.0, RUBRIC), d.WeightedPart(1.0, NLI)))


def filled(spec: d.ItemSpec, response: str) -> d.ItemSpec:
    """What the reader must give back: ``spec`` with ``response`` in its response field(s)."""
    if isinstance(spec, d.RubricScoreSpec):
        return d.RubricScoreSpec(spec.context, response, spec.rules, spec.task, spec.aggregate)
    if isinstance(spec, d.NliConstraintsSpec):
        return d.NliConstraintsSpec(response, spec.answer, spec.preference, spec.reward_function)
    if isinstance(spec, d.ParlRewardSpec):
        return d.ParlRewardSpec(spec.history, response, spec.target, spec.baselines, spec.variant,
                                spec.task)
    return d.WeightedSpec(parts=tuple(d.WeightedPart(p.weight, filled(p.spec, response))  # type: ignore[arg-type]
                                      for p in spec.parts))


@pytest.mark.parametrize(("spec", "kind"), [
    (RUBRIC, "rubric_score"), (NLI, "nli_constraints"), (PARL, "parl_reward"),
    (WEIGHTED, "weighted"),
])
def test_every_kind_round_trips_through_dict_and_json_text(spec: d.ItemSpec, kind: str) -> None:
    extra = extra_info(spec, user_id="u7", index=4)
    assert set(extra) == {"score_item", "user_id", "index"}
    assert json.loads(extra["score_item"])["id"] == "u7"
    for given in (extra, json.dumps(extra)):  # verl's dict, TRL's extra_info_json
        row = read_row(given)
        assert (row.kind, row.user_id, row.index) == (kind, "u7", 4)
        item = row.item("the rollout", item_id="u7#4")
        assert item == d.ScoreItem(item_id="u7#4", spec=filled(spec, "the rollout"))
    # the template is reused for every rollout: filling one leaves it empty
    again = read_row(extra)
    assert again.item("one", item_id="a").spec != again.item("two", item_id="a").spec


def test_the_openrlhf_route_fills_the_same_template_the_same_way() -> None:
    extra = extra_info(WEIGHTED, user_id="u1", index=0)
    request = openrlhf.score_request(
        {"query": ["Q: the rollout"], "prompts": ["Q:"], "labels": [extra["score_item"]]},
        end_markers=())
    assert item_from_proto(request.items[0], 0) == read_row(extra).item("the rollout",
                                                                       item_id="u1")


def test_a_template_with_its_response_set_is_refused_by_writer_and_reader() -> None:
    with pytest.raises(ExtraInfoError, match=r"rubric_score\.text is set"):
        extra_info(d.RubricScoreSpec(context="c", text="already", rules=("r",)), user_id="u",
                   index=0)
    template = read_row(extra_info(PARL, user_id="u", index=0)).template
    template.parl_reward.policy_output = "set"
    with pytest.raises(ExtraInfoError, match=r"parl_reward\.policy_output is set"):
        fill_response(template, "x", where="here")


OLD_ROW = {"kind": "rubric_score", "task": "news", "user_id": "u1", "index": 0, "history": [],
           "target": {"context": "c", "text": "t"}, "rules": ["r"], "answer": "", "preference": ""}


@pytest.mark.parametrize(("extra", "match"), [
    (OLD_ROW, r"old format \(keys \['kind', 'history', 'rules', 'answer'\].*re-run "
              r"`python -m trainer\.data\.prepare`"),
    ({"user_id": "u"}, r"no 'score_item' \(keys \['user_id'\]\); prepare the data"),
    ({"score_item": '{"id": "u"}'}, "sets no reward kind"),
    ({"score_item": '{"nope": 1}'}, "is not a reward.v1.ScoreItem"),
    ("{not json", "is not JSON"),
    ("[1]", "is not a JSON object"),
])
def test_what_is_not_a_row_is_refused_saying_what_to_do(extra: object, match: str) -> None:
    with pytest.raises(ExtraInfoError, match=match):
        read_row(extra)  # type: ignore[arg-type]


def test_prepared_files_of_the_old_format_are_refused_before_training(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from trainer.data.prepare import check_prepared, main

    pq.write_table(pa.table({"extra_info": [OLD_ROW]}), tmp_path / "old_verl.parquet")
    pq.write_table(pa.table({"extra_info_json": [json.dumps(OLD_ROW)]}), tmp_path / "old_trl.parquet")
    for name in ("old_verl.parquet", "old_trl.parquet"):
        with pytest.raises(ExtraInfoError, match=r"re-run `python -m trainer\.data\.prepare`"):
            check_prepared(tmp_path / name)
    assert main(["--sample", "--task", "personalized_generator", "--out", str(tmp_path)]) == 0
    for name in ("train.parquet", "val.parquet", "trl_train.parquet", "trl_val.parquet"):
        check_prepared(tmp_path / name)  # what prepare writes today passes


def test_the_personalized_prompt_renders_history_with_the_servers_renderer() -> None:
    from reward_server.rubric.templates import render_history
    from trainer.data.prepare import sample_records
    from trainer.tasks import personalized_generator

    rec = sample_records()[4]
    user = personalized_generator.build_prompt(rec, history_limit=3)[1]["content"]
    rendered = render_history(rec.history[-3:], rec.task, heading="Example")
    assert rendered in user and rendered.startswith("### Example 1\n")
    assert user.count("### Example") == 3


def test_verl_check_config_lists_data_files_of_the_old_format(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    omegaconf = pytest.importorskip("omegaconf")
    from trainer import verl_checks
    from trainer.data.prepare import main

    pq.write_table(pa.table({"extra_info": [OLD_ROW]}), tmp_path / "old.parquet")
    assert main(["--sample", "--task", "rubric_generator", "--out", str(tmp_path / "new")]) == 0
    config = omegaconf.OmegaConf.create({"data": {
        "train_files": [str(tmp_path / "new" / "train.parquet"), str(tmp_path / "old.parquet")],
        "val_files": str(tmp_path / "new" / "val.parquet")}})
    (problem,) = verl_checks.row_problems(config)
    assert problem.startswith(f"{tmp_path / 'old.parquet'}: row 0 extra_info is a row of the old")
