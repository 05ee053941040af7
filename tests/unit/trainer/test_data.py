"""Loaders on the shipped sample and on malformed records; prepared parquet round-trips."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reward_server.api.rows import read_row
from reward_server.domain import ParlVariant, RewardKind, Task
from trainer.data import loaders
from trainer.data.prepare import (
    SAMPLE_DIR,
    build_rows,
    main,
    sample_groups,
    sample_records,
    split,
    to_trl,
)
from trainer.data.records import DataFormatError


def write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_sample_has_nine_users_across_three_tasks() -> None:
    records = sample_records()
    assert len(records) == 9
    assert {r.task for r in records} == {Task.AMAZON, Task.NEWS, Task.REDDIT}
    for r in records:
        assert len(r.history) == 10
        assert r.target.text.strip()
        assert [m for m, _ in r.baselines] == ["Non", "RAG", "SFT", "GRPO", "SFT+GRPO"]
        assert r.rules and r.answer and r.preference
    assert sum(p.stat().st_size for p in SAMPLE_DIR.glob("*.jsonl")) < 300_000


def test_amazon_loader_builds_context_from_the_four_fields() -> None:
    # default: PARL's released metadata block (parl_rm_a.py), labels and final newline included
    (first, *_) = loaders.load_amazon(SAMPLE_DIR / "amazon.jsonl")
    assert first.user_id == "amz_enthusiast"
    assert first.history[0].context == (
        "[Item Title]: Bamboo Cutting Board Set\n"
        "[Item Description]: Three boards of organic bamboo with juice grooves.\n"
        "[Output Review Rating]: 5\n[Output Review Title]: Love it!\n"
    )
    assert first.history[0].text.startswith("Honestly, this bamboo cutting board set")
    (short, *_) = loaders.load_amazon(SAMPLE_DIR / "amazon.jsonl", context_labels="short")
    assert short.history[0].context == (
        "[Item Title]: Bamboo Cutting Board Set\n"
        "[Item Description]: Three boards of organic bamboo with juice grooves.\n"
        "[Review Rating]: 5\n[Review Title]: Love it!"
    )
    assert short.target.context.startswith("[Item Title]") and "[Review Rating]" in short.target.context


def test_lamp4_strips_the_instruction_and_reads_separate_golds(tmp_path: Path) -> None:
    questions = tmp_path / "q.json"
    questions.write_text(json.dumps([{
        "id": "310", "input": "Generate a headline for the following article: Rain fell.",
        "profile": [{"text": "Sun shone.", "title": "Sunny day", "id": "1"}],
    }]))
    golds = tmp_path / "o.json"
    golds.write_text(json.dumps({"task": "LaMP_4", "golds": [{"id": "310", "output": "Wet"}]}))
    (rec,) = loaders.load_lamp4(questions, outputs=golds)
    assert (rec.user_id, rec.task, rec.target.context, rec.target.text) == (
        "310", Task.NEWS, "Rain fell.", "Wet")
    assert rec.history[0].context == "Sun shone." and rec.history[0].text == "Sunny day"


def test_longlamp_keeps_last_ten_history_items(tmp_path: Path) -> None:
    profile = [{"summary": f"s{i}", "content": f"c{i}"} for i in range(14)]
    path = write(tmp_path / "r.jsonl", [{"author": "u1", "input":
                 "Generate the content for a reddit post using this summary: a trip",
                 "output": "post", "profile": profile}])
    (rec,) = loaders.load_longlamp(path)
    assert rec.target.context == "a trip"
    assert [h.text for h in rec.history] == [f"c{i}" for i in range(4, 14)]


@pytest.mark.parametrize(
    ("loader", "record", "line_field"),
    [
        (loaders.load_amazon, {"user_id": "u", "profile": [{"item_title": "t", "description": "d", "rating": 5,
         "title": "x"}], "data": {}}, "profile[0].text"),
        (loaders.load_amazon, {"user_id": "u", "profile": "oops", "data": {}}, "profile"),
        (loaders.load_lamp4, {"id": "1", "input": "Generate a headline for the following "
         "article: a", "profile": []}, "output"),
        (loaders.load_longlamp, {"author": "u", "input": "x", "output": "",
         "profile": []}, "output"),
    ],
)
def test_malformed_record_names_file_line_and_field(tmp_path, loader, record, line_field) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("\n" + json.dumps(record) + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError) as err:
        loader(path)
    assert err.value.line == 2 and err.value.field == line_field
    assert f"{path}:2" in str(err.value) and repr(line_field) in str(err.value)


def test_invalid_json_line_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    path.write_text('{"user_id": "u", "method": "m", "output": "o"}\n{not json}\n')
    with pytest.raises(DataFormatError, match=r"b\.jsonl:2: field '<json>'"):
        loaders.load_baselines(path)


def test_duplicate_baseline_method_is_rejected(tmp_path: Path) -> None:
    row = {"user_id": "u", "method": "RAG", "output": "o"}
    path = write(tmp_path / "b.jsonl", [row, row])
    with pytest.raises(DataFormatError, match="already has a 'RAG' baseline"):
        loaders.load_baselines(path)


def test_parl_rows_have_verls_schema_and_round_trip(tmp_path: Path) -> None:
    import datasets

    assert main(["--sample", "--task", "rubric_generator", "--variant", "B",
                 "--out", str(tmp_path)]) == 0
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "train.parquet"))["train"]
    assert set(ds.column_names) == {"data_source", "prompt", "ability", "reward_model",
                                    "extra_info"}
    train, _ = split(sample_groups(), 1)  # the default held-out split: 1 user per source
    rows = build_rows(train, "rubric_generator", variant=ParlVariant.PARL_B)
    for got, want in zip(ds, rows, strict=True):
        assert got["prompt"] == want["prompt"]
        assert got["reward_model"] == {"style": "model", "ground_truth": want["reward_model"][
            "ground_truth"]}
        assert got["extra_info"] == want["extra_info"]
        template = json.loads(got["extra_info"]["score_item"])
        assert template["parl_reward"]["variant"] == "PARL_VARIANT_B"
        assert [m["role"] for m in got["prompt"]] == ["system", "user"]
    assert ds[0]["data_source"] == "personal_reward/rubric_generator/amazon"


def test_rubric_prompt_is_the_servers_generator_prompt() -> None:
    from reward_server.rubric.settings import RubricSettings
    from reward_server.rubric.templates import generator_request

    rec = sample_records()[3]
    (row,) = build_rows([rec], "rubric_generator")
    req = generator_request(rec.history, rec.task, RubricSettings.model_validate({}), seed=None)
    assert row["prompt"] == [{"role": "system", "content": req.system},
                             {"role": "user", "content": req.user}]


def test_personalized_rows_need_rules_and_trl_rows_carry_extra_info(tmp_path: Path) -> None:
    records = sample_records()
    rows = build_rows(records, "personalized_generator", reward_kind=RewardKind.WEIGHTED,
                      weights={"rubric_score": 3.0, "nli_constraints": 1.0})
    parts = json.loads(rows[0]["extra_info"]["score_item"])["weighted"]["parts"]
    assert [(p["weight"], *(k for k in p if k != "weight")) for p in parts] == [
        (3.0, "rubric_score"), (1.0, "nli_constraints")]
    assert rows[0]["prompt"][1]["content"].endswith("Answer with the review only.")
    trl = to_trl(rows)
    assert json.loads(trl[2]["extra_info_json"]) == rows[2]["extra_info"]
    bare = records[0].with_extras(rules=())
    with pytest.raises(DataFormatError, match="no induced rules"):
        build_rows([bare], "personalized_generator", reward_kind=RewardKind.RUBRIC_SCORE)
    assert main(["--task", "rubric_generator", "--out", str(tmp_path)]) == 2


def test_openrlhf_jsonl_loads_as_openrlhf_loads_it(tmp_path: Path) -> None:
    """OpenRLHF reads --data.prompt_dataset with HF datasets; --data.input_key input and
    --data.label_key label then give the chat messages and the label (a JSON string)."""
    import datasets

    assert main(["--sample", "--task", "personalized_generator", "--format", "openrlhf",
                 "--val-size", "1", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["openrlhf_train.jsonl",
                                                          "openrlhf_val.jsonl"]
    ds = datasets.load_dataset("json", data_files=str(tmp_path / "openrlhf_train.jsonl"))["train"]
    assert set(ds.column_names) == {"input", "label", "datasource"}
    rows = build_rows(sample_records(), "personalized_generator")
    assert ds[0]["input"] == rows[0]["prompt"]
    label = json.loads(ds[0]["label"])
    assert label == json.loads(rows[0]["extra_info"]["score_item"])  # the row's template
    assert label["id"] == rows[0]["extra_info"]["user_id"] == sample_records()[0].user_id
    assert label["rubric_score"]["rules"] == list(sample_records()[0].rules)
    assert label["rubric_score"]["text"] == ""  # the response comes from OpenRLHF's query


def read_users(path: Path) -> list[tuple[str, str]]:
    import pyarrow.parquet as pq

    return [user(e) for e in pq.read_table(path).column("extra_info").to_pylist()]


def user(extra: dict | str) -> tuple[str, str]:
    """(task, user_id) of a rubric_generator row's extra_info."""
    row = read_row(extra)
    return row.item("", item_id="x").spec.task.value, row.user_id  # type: ignore[union-attr]


def test_val_holds_out_the_last_user_of_each_source_by_default(tmp_path: Path) -> None:
    assert main(["--sample", "--task", "rubric_generator", "--out", str(tmp_path)]) == 0
    train, val = read_users(tmp_path / "train.parquet"), read_users(tmp_path / "val.parquet")
    groups = sample_groups()
    assert val == [(g[-1].task.value, g[-1].user_id) for g in groups]  # one per source
    assert train == [(r.task.value, r.user_id) for g in groups for r in g[:-1]]
    assert not set(train) & set(val)
    trl_val = read_trl_users(tmp_path / "trl_val.parquet")
    assert trl_val == val


def read_trl_users(path: Path) -> list[tuple[str, str]]:
    import pyarrow.parquet as pq

    return [user(e) for e in pq.read_table(path).column("extra_info_json").to_pylist()]


def test_val_size_zero_writes_no_val_files(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert main(["--sample", "--task", "rubric_generator", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "val.parquet").is_file()
    assert main(["--sample", "--task", "rubric_generator", "--val-size", "0",
                 "--out", str(tmp_path)]) == 0
    assert len(read_users(tmp_path / "train.parquet")) == 9
    # the earlier run's val files are gone: they would pair with the wrong training rows
    assert not (tmp_path / "val.parquet").exists() and not (tmp_path / "trl_val.parquet").exists()
    assert "no val split (--val-size 0)" in caplog.text and "trainer.test_freq=-1" in caplog.text


@pytest.mark.parametrize(("size", "why"), [
    ("3", "holds out every user of a source (amazon: 3 users)"),
    ("-1", "give a number of users >= 0"),
])
def test_a_val_size_that_leaves_a_source_nothing_to_train_on_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], size: str, why: str
) -> None:
    assert main(["--sample", "--task", "rubric_generator", "--val-size", size,
                 "--out", str(tmp_path)]) == 2
    assert why in capsys.readouterr().err


def test_a_user_in_both_splits_is_refused() -> None:
    (amazon, *_) = sample_groups()
    with pytest.raises(ValueError, match="have records both in the held-out last 1"):
        split([[*amazon, amazon[0]]], 1)


def test_progress_counts_records() -> None:
    bar = loaders._progress(iter(["a", "b", "c"]), "x")
    assert list(bar) == ["a", "b", "c"]
    assert getattr(bar, "total", 3) == 3
