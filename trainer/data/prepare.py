"""``python -m trainer.data.prepare``: raw data -> verl parquet + TRL dataset.

Examples::

    # the shipped sample, rubric-generator task (PARL-A)
    python -m trainer.data.prepare --sample --task rubric_generator --out data/parl_a
    # LaMP-4 with separate golds, personalized generator scored by induced rules
    python -m trainer.data.prepare --task personalized_generator \\
        --source news=LaMP_4/train_questions.json:LaMP_4/train_outputs.json \\
        --rules rules.jsonl --out data/news_pg

Writes, per ``--format`` (default: verl and trl):

* verl: ``OUT/train.parquet`` and ``OUT/val.parquet`` (data_source, prompt, ability,
  reward_model, extra_info);
* trl: ``OUT/trl_train.parquet`` / ``OUT/trl_val.parquet`` (prompt, data_source,
  extra_info_json: the same extra_info as JSON text);
* openrlhf: ``OUT/openrlhf_train.jsonl`` / ``OUT/openrlhf_val.jsonl`` (input: the chat
  messages, label: extra_info's ScoreItem template, datasource), for
  the reward server's OpenRLHF route: ``--data.prompt_dataset OUT/openrlhf_train.jsonl
  --data.input_key input --data.label_key label --data.apply_chat_template
  --reward.remote_url http://HOST:PORT/openrlhf/reward`` (docs/http.md).

Every format carries one row contract (:mod:`reward_server.api.rows`):
``extra_info = {"score_item": <reward.v1.ScoreItem JSON without its response>, "user_id",
"index"}``. Files prepared before it are refused with a message to re-run this command.

``--val-size N`` (default 1) holds out the last N users of each source: the val files hold
only users the policy never trains on, so verl's validation (on in the presets) measures
generalisation to new users. ``--val-size 0`` writes no val files (then point
``data.val_files`` at a held-out split, or turn validation off: ``trainer.test_freq=-1
trainer.val_before_train=false``); a val split never repeats training rows.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reward_server.api.rows import TEMPLATE_KEY, read_row
from reward_server.domain import ParlVariant, RewardKind, RubricAggregate
from trainer.data.loaders import (
    CONTEXT_LABELS,
    LOADERS,
    ContextLabels,
    load_amazon,
    load_baselines,
    load_constraints,
    load_lamp4,
    load_rules,
)
from trainer.data.records import DataFormatError, UserRecord
from trainer.tasks.common import PERSONALIZED_KINDS, TASK_NAMES
from trainer.tasks.rows import build_row

logger = logging.getLogger(__name__)

SAMPLE_DIR = Path(__file__).resolve().parent / "sample"
SAMPLE_SOURCES = {"amazon": "amazon.jsonl", "news": "lamp4.jsonl", "reddit": "longlamp.jsonl"}


def load_source(
    spec: str, *, history_limit: int, amazon_context_labels: ContextLabels = "released"
) -> list[UserRecord]:
    """``FORMAT=PATH`` (news also ``news=QUESTIONS:OUTPUTS``) -> records."""
    fmt, sep, path = spec.partition("=")
    if not sep or fmt not in LOADERS:
        raise ValueError(
            f"--source {spec!r}: expected FORMAT=PATH with FORMAT in {sorted(LOADERS)}"
        )
    if fmt == "news" and ":" in path:
        questions, outputs = path.split(":", 1)
        return load_lamp4(Path(questions), outputs=Path(outputs), history_limit=history_limit)
    if fmt == "amazon":
        return load_amazon(Path(path), history_limit=history_limit, context_labels=amazon_context_labels)
    return LOADERS[fmt](Path(path), history_limit=history_limit)


def attach(
    records: Sequence[UserRecord],
    *,
    baselines: Path | None = None,
    rules: Path | None = None,
    constraints: Path | None = None,
) -> list[UserRecord]:
    """Join side files onto records by ``user_id``."""
    b = load_baselines(baselines) if baselines else {}
    r = load_rules(rules) if rules else {}
    c = load_constraints(constraints) if constraints else {}
    out = []
    for rec in records:
        answer, preference = c.get(rec.user_id, (None, None))
        out.append(rec.with_extras(
            baselines=tuple(b[rec.user_id]) if rec.user_id in b else None,
            rules=r.get(rec.user_id), answer=answer, preference=preference,
        ))
    return out


def sample_groups(*, history_limit: int = 10, rules: Path | None = None) -> list[list[UserRecord]]:
    """The shipped sample's users, one list per source, with baselines, rules and constraints
    attached; ``rules`` (JSONL ``{user_id, rules}``) replaces the sample's own rubrics."""
    return [attach(LOADERS[fmt](SAMPLE_DIR / name, history_limit=history_limit),
                   baselines=SAMPLE_DIR / "baselines.jsonl", rules=rules or SAMPLE_DIR / "rules.jsonl",
                   constraints=SAMPLE_DIR / "constraints.jsonl")
            for fmt, name in SAMPLE_SOURCES.items()]


def sample_records(*, history_limit: int = 10) -> list[UserRecord]:
    """Every user of the shipped sample, with baselines, rules and constraints attached."""
    return [r for g in sample_groups(history_limit=history_limit) for r in g]


def split(groups: Sequence[Sequence[UserRecord]], val_size: int) -> tuple[list[UserRecord], list[UserRecord]]:
    """(train, val): the last ``val_size`` users of each source held out, never in both."""
    if val_size < 0:
        raise ValueError(f"--val-size {val_size}: give a number of users >= 0")
    train: list[UserRecord] = []
    val: list[UserRecord] = []
    for g in groups:
        if val_size and len(g) <= val_size:
            where = g[0].task.value if g else "?"
            raise ValueError(f"--val-size {val_size} holds out every user of a source "
                             f"({where}: {len(g)} users), leaving none of it to train on; lower "
                             "it (0: no val split)")
        cut = len(g) - val_size
        train += g[:cut]
        val += g[cut:]
    overlap = sorted({(r.task.value, r.user_id) for r in val} & {(r.task.value, r.user_id) for r in train})
    if overlap:
        raise ValueError(f"users {overlap[:5]} have records both in the held-out last {val_size} "
                         "of a source and earlier: the val split would repeat training users; "
                         "give each user one record")
    return train, val


def build_rows(records: Sequence[UserRecord], task: str, **opts: Any) -> list[dict[str, Any]]:
    return [build_row(task, rec, i, **opts) for i, rec in enumerate(records)]


def to_trl(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """TRL rows: the conversational ``prompt`` plus the reward's inputs as one JSON string."""
    return [{"prompt": r["prompt"], "data_source": r["data_source"],
             "extra_info_json": json.dumps(r["extra_info"], ensure_ascii=False)} for r in rows]


def to_openrlhf(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenRLHF rows: the chat messages as ``input``, the row's ScoreItem template as ``label``
    (JSON text; see reward_server.rpc.openrlhf), ``datasource``."""
    return [{"input": r["prompt"], "label": r["extra_info"][TEMPLATE_KEY],
             "datasource": r["data_source"]} for r in rows]


def check_prepared(path: Path) -> None:
    """Refuse a prepared verl/TRL parquet whose first row is not of the current row contract
    (:class:`~reward_server.api.rows.ExtraInfoError`, which says to re-run this
    command): a training run then stops before it loads a model, not at its first reward."""
    import pyarrow.parquet as pq

    names = pq.read_schema(path).names
    column = next((c for c in ("extra_info", "extra_info_json") if c in names), None)
    if column is None:
        raise ValueError(f"{path}: no extra_info or extra_info_json column; prepare the data "
                         "with `python -m trainer.data.prepare`")
    batch = next(pq.ParquetFile(path).iter_batches(columns=[column], batch_size=1), None)
    if batch is not None and batch.num_rows:
        read_row(batch.column(0)[0].as_py(), where=f"{path}: row 0 {column}")


def write_jsonl(rows: Sequence[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_parquet(rows: Sequence[dict[str, Any]], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(list(rows)), path)


FORMATS = ("verl", "trl", "openrlhf")
VAL_FILES = ("val.parquet", "trl_val.parquet", "openrlhf_val.jsonl")


def write_all(
    rows: Sequence[dict[str, Any]],
    val: Sequence[dict[str, Any]],
    out: Path,
    formats: Sequence[str] = ("verl", "trl"),
) -> None:
    """Train files, and val files when ``val`` has rows (none are written without)."""
    for name in VAL_FILES:  # a val file left by an earlier run would pair with the wrong train
        (out / name).unlink(missing_ok=True)
    if "verl" in formats:
        write_parquet(rows, out / "train.parquet")
        if val:
            write_parquet(val, out / "val.parquet")
    if "trl" in formats:
        write_parquet(to_trl(rows), out / "trl_train.parquet")
        if val:
            write_parquet(to_trl(val), out / "trl_val.parquet")
    if "openrlhf" in formats:
        write_jsonl(to_openrlhf(rows), out / "openrlhf_train.jsonl")
        if val:
            write_jsonl(to_openrlhf(val), out / "openrlhf_val.jsonl")


def _weights(text: str | None) -> dict[str, float] | None:
    if not text:
        return None
    out = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        out[key.strip()] = float(value)
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer.data.prepare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", choices=TASK_NAMES, required=True)
    p.add_argument("--sample", action="store_true", help="use the shipped sample (all 3 sources)")
    p.add_argument("--source", action="append", default=[],
                   help="FORMAT=PATH, FORMAT in amazon|news|reddit (news=Q.json:OUT.json)")
    p.add_argument("--baselines", type=Path, help="JSONL {user_id, method, output}")
    p.add_argument("--rules", type=Path, help="JSONL {user_id, rules} (with --sample: instead of the "
                   "sample's own rubrics)")
    p.add_argument("--constraints", type=Path, help="JSONL {user_id, answer, preference}")
    p.add_argument("--variant", choices=[v.value for v in ParlVariant], default="A")
    p.add_argument("--reward-kind", choices=[k.value for k in PERSONALIZED_KINDS],
                   default=RewardKind.RUBRIC_SCORE.value)
    p.add_argument("--weights", help="rubric_score=0.5,nli_constraints=0.5 (weighted kind)")
    p.add_argument("--aggregate", choices=[a.value for a in RubricAggregate])
    p.add_argument("--history-limit", type=int, default=10)
    p.add_argument("--val-size", type=int, default=1,
                   help="hold out the last N users of each source as the val split (default 1; "
                        "0: no val files)")
    p.add_argument("--amazon-context-labels", choices=CONTEXT_LABELS, default="released",
                   help="released: PARL's [Output Review Rating]/[Output Review Title] metadata block "
                        "(default); short: [Review Rating]/[Review Title], this project's data before "
                        "template parl-released")
    p.add_argument("--format", action="append", choices=FORMATS, dest="formats",
                   help="files to write (repeat for several; default: verl and trl)")
    p.add_argument("--out", type=Path, required=True)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        groups: list[list[UserRecord]] = []
        if args.sample:
            groups += sample_groups(history_limit=args.history_limit, rules=args.rules)
        for spec in args.source:
            groups.append(attach(load_source(spec, history_limit=args.history_limit,
                                             amazon_context_labels=args.amazon_context_labels),
                                 baselines=args.baselines, rules=args.rules,
                                 constraints=args.constraints))
        if not groups:
            raise ValueError("no data: pass --sample or at least one --source FORMAT=PATH")
        train, val = split(groups, args.val_size)
        opts: dict[str, Any] = {
            "variant": ParlVariant(args.variant), "reward_kind": RewardKind(args.reward_kind),
            "weights": _weights(args.weights), "history_limit": args.history_limit,
            "aggregate": RubricAggregate(args.aggregate) if args.aggregate else None,
        }
        rows, val_rows = build_rows(train, args.task, **opts), build_rows(val, args.task, **opts)
        if not val_rows:
            logger.warning("no val split (--val-size 0): no val files written. The verl presets "
                           "validate: set data.val_files to a held-out split, or turn validation "
                           "off (trainer.test_freq=-1 trainer.val_before_train=false)")
        write_all(rows, val_rows, args.out, args.formats or ("verl", "trl"))
    except (DataFormatError, ValueError) as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    logger.info("wrote %d train / %d val rows (%d held-out users) for %s to %s", len(rows),
                len(val_rows), len({r["extra_info"]["user_id"] for r in val_rows}), args.task,
                args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
