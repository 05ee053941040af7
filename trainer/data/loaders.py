"""Loaders for the three PARL data sets and our side files (docs/parl.md §6).

Formats (one user per record; ``.jsonl`` = one JSON object per line, ``.json`` = a JSON array):

DPL-Amazon (``load_amazon``)
    ``{"user_id", "profile": [{"item_title", "description", "rating", "title", "text"}, ...],
    "data": {"item_title", "description", "rating", "title", "text"}}`` (DPL's names; the
    denormalized join of its main split, profile map and item metadata). ``item_description`` is
    accepted for ``description``. Context = item title, description, rating, review title, as
    PARL's released code writes it (``context_labels="released"``: ``[Item Title]: ...``,
    ``[Item Description]: ...``, ``[Output Review Rating]: ...``, ``[Output Review Title]: ...``,
    each line ending in a newline); ``"short"``: the labels ``[Review Rating]``/``[Review Title]``
    and no final newline (this project's data before template parl-released). Text = review
    text; ``data`` is the target.
LaMP-4 news headlines (``load_lamp4``)
    LaMP's questions file ``[{"id", "input": "Generate a headline for the following article:
    ...", "profile": [{"text", "title"}]}]`` plus its outputs file ``{"golds": [{"id",
    "output"}]}``; or one file whose records carry ``output`` inline. Context = article,
    text = headline. ``user_id`` defaults to ``id``.
LongLaMP topic writing (``load_longlamp``)
    ``{"author" | "user_id", "input": "Generate the content for a reddit post ...", "output",
    "profile": [{"summary", "content"}]}``. Context = summary, text = post content.
Side files (JSONL): baselines ``{"user_id", "method", "output"}``; induced rules
    ``{"user_id", "rules": [str]}``; NLI constraints ``{"user_id", "answer", "preference"}``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from reward_server.domain import HistoryItem, Task
from trainer.data.records import DataFormatError, UserRecord

logger = logging.getLogger(__name__)

LAMP4_PREFIX = re.compile(r"^\s*generate a headline for the following article\s*:\s*", re.I)
LONGLAMP_PREFIX = re.compile(
    r"^\s*generate the content for a reddit post(?:\s+using this summary)?\s*:?\s*", re.I
)


def _progress(it: Any, desc: str) -> Any:
    """``it``'s records with a progress bar that counts them (``12/40 rec``) on a terminal;
    no bar when stderr is not one (logs, CI)."""
    records = list(it)  # the loaders keep every record anyway; the total makes the bar count
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm ships with the server extra
        return records
    return tqdm(records, total=len(records), desc=desc, unit=" rec", leave=False, disable=None)


def iter_records(path: Path) -> Iterator[tuple[int | None, str, Mapping[str, Any]]]:
    """Yield ``(line, field_prefix, record)``; ``line`` is 1-based for JSONL, None for JSON."""
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(path, None, "<file>", "no such file")
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise DataFormatError(path, e.lineno, "<json>", f"invalid JSON: {e.msg}") from None
        if isinstance(data, Mapping):
            data = [data]
        if not isinstance(data, list):
            raise DataFormatError(path, None, "<root>", "expected a JSON array of records")
        for i, rec in enumerate(data):
            if not isinstance(rec, Mapping):
                raise DataFormatError(path, None, f"[{i}]", "expected a JSON object")
            yield None, f"[{i}].", rec
        return
    with path.open(encoding="utf-8") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except json.JSONDecodeError as e:
                raise DataFormatError(path, lineno, "<json>", f"invalid JSON: {e.msg}") from None
            if not isinstance(rec, Mapping):
                raise DataFormatError(path, lineno, "<record>", "expected a JSON object")
            yield lineno, "", rec


class _Reader:
    """Field access that reports file, line and dotted field name on failure."""

    def __init__(self, path: Path, line: int | None, prefix: str) -> None:
        self.path, self.line, self.prefix = path, line, prefix

    def fail(self, name: str, problem: str) -> DataFormatError:
        return DataFormatError(self.path, self.line, self.prefix + name, problem)

    def obj(self, rec: Mapping[str, Any], name: str) -> Mapping[str, Any]:
        value = rec.get(name)
        if not isinstance(value, Mapping):
            raise self.fail(name, "missing" if value is None else "expected an object")
        return value

    def items(self, rec: Mapping[str, Any], name: str) -> list[Mapping[str, Any]]:
        value = rec.get(name)
        if not isinstance(value, list):
            raise self.fail(name, "missing" if value is None else "expected a list")
        for i, v in enumerate(value):
            if not isinstance(v, Mapping):
                raise self.fail(f"{name}[{i}]", "expected an object")
        return value

    def text(
        self, rec: Mapping[str, Any], *names: str, where: str = "", allow_empty: bool = False
    ) -> str:
        for name in names:
            if name in rec and rec[name] is not None:
                value = rec[name]
                if isinstance(value, int | float) and not isinstance(value, bool):
                    value = str(value)
                if not isinstance(value, str):
                    raise self.fail(where + name, f"expected a string, got {type(value).__name__}")
                if not allow_empty and not value.strip():
                    raise self.fail(where + name, "must not be empty")
                return value
        tried = f" (also tried {list(names[1:])})" if names[1:] else ""
        raise self.fail(where + names[0], "missing" + tried)


def _finish(
    r: _Reader, user_id: str, task: Task, history: list[HistoryItem], target: HistoryItem,
    *, history_limit: int, min_history: int,
) -> UserRecord:
    if len(history) < min_history:
        raise r.fail("profile", f"user {user_id!r} has {len(history)} history items; "
                     f"at least {min_history} needed")
    return UserRecord(
        user_id=user_id, task=task, history=tuple(history[-history_limit:]), target=target,
        source=str(r.path),
    )


ContextLabels = Literal["released", "short"]
CONTEXT_LABELS: tuple[ContextLabels, ...] = ("released", "short")


def amazon_context(r: _Reader, rec: Mapping[str, Any], where: str, *, labels: ContextLabels = "released") -> str:
    """The Amazon context block (see module doc; released: PARL's parl_rm_a.py metadata)."""
    title = r.text(rec, "item_title", where=where)
    desc = r.text(rec, "description", "item_description", where=where, allow_empty=True)
    rating = r.text(rec, "rating", "review_rating", where=where)
    review_title = r.text(rec, "title", "review_title", where=where, allow_empty=True)
    if labels == "released":
        return (
            f"[Item Title]: {title}\n[Item Description]: {desc}\n"
            f"[Output Review Rating]: {rating}\n[Output Review Title]: {review_title}\n"
        )
    return (
        f"[Item Title]: {title}\n[Item Description]: {desc}\n"
        f"[Review Rating]: {rating}\n[Review Title]: {review_title}"
    )


def load_amazon(
    path: Path, *, history_limit: int = 10, min_history: int = 1, context_labels: ContextLabels = "released"
) -> list[UserRecord]:
    """DPL-Amazon users (see module doc)."""
    if context_labels not in CONTEXT_LABELS:
        raise ValueError(f"context_labels={context_labels!r}: expected one of {CONTEXT_LABELS}")
    out: list[UserRecord] = []
    for line, prefix, rec in _progress(iter_records(Path(path)), f"amazon {Path(path).name}"):
        r = _Reader(Path(path), line, prefix)
        user_id = r.text(rec, "user_id")
        history = [
            HistoryItem(
                context=amazon_context(r, p, f"profile[{i}].", labels=context_labels),
                text=r.text(p, "text", "review_text", where=f"profile[{i}]."),
            )
            for i, p in enumerate(r.items(rec, "profile"))
        ]
        data = r.obj(rec, "data")
        target = HistoryItem(
            context=amazon_context(r, data, "data.", labels=context_labels),
            text=r.text(data, "text", "review_text", where="data."),
        )
        out.append(_finish(r, user_id, Task.AMAZON, history, target,
                           history_limit=history_limit, min_history=min_history))
    return out


def _lamp_golds(path: Path) -> dict[str, str]:
    golds: dict[str, str] = {}
    for line, prefix, rec in iter_records(path):
        r = _Reader(path, line, prefix)
        entries = r.items(rec, "golds") if "golds" in rec else [rec]
        for i, g in enumerate(entries):
            where = f"golds[{i}]." if "golds" in rec else ""
            golds[r.text(g, "id", where=where)] = r.text(g, "output", where=where)
    return golds


def load_lamp4(
    path: Path, *, outputs: Path | None = None, history_limit: int = 10, min_history: int = 1
) -> list[UserRecord]:
    """LaMP-4 users (see module doc); ``outputs`` is LaMP's separate golds file."""
    golds = _lamp_golds(Path(outputs)) if outputs is not None else {}
    out: list[UserRecord] = []
    for line, prefix, rec in _progress(iter_records(Path(path)), f"lamp4 {Path(path).name}"):
        r = _Reader(Path(path), line, prefix)
        rec_id = r.text(rec, "id", "user_id")
        user_id = r.text(rec, "user_id", "id")
        article = LAMP4_PREFIX.sub("", r.text(rec, "input"), count=1)
        if "output" in rec:
            headline = r.text(rec, "output")
        elif rec_id in golds:
            headline = golds[rec_id]
        else:
            raise r.fail("output", f"no inline output and id {rec_id!r} is not in the outputs "
                         "file" if outputs else "missing (or pass the LaMP outputs file)")
        history = [
            HistoryItem(
                context=r.text(p, "text", where=f"profile[{i}]."),
                text=r.text(p, "title", where=f"profile[{i}]."),
            )
            for i, p in enumerate(r.items(rec, "profile"))
        ]
        out.append(_finish(r, user_id, Task.NEWS, history, HistoryItem(article, headline),
                           history_limit=history_limit, min_history=min_history))
    return out


def load_longlamp(
    path: Path, *, history_limit: int = 10, min_history: int = 1
) -> list[UserRecord]:
    """LongLaMP topic-writing users (see module doc)."""
    out: list[UserRecord] = []
    for line, prefix, rec in _progress(iter_records(Path(path)), f"longlamp {Path(path).name}"):
        r = _Reader(Path(path), line, prefix)
        user_id = r.text(rec, "user_id", "author", "name", "id")
        summary = LONGLAMP_PREFIX.sub("", r.text(rec, "input"), count=1)
        history = [
            HistoryItem(
                context=r.text(p, "summary", where=f"profile[{i}]."),
                text=r.text(p, "content", where=f"profile[{i}]."),
            )
            for i, p in enumerate(r.items(rec, "profile"))
        ]
        target = HistoryItem(summary, r.text(rec, "output"))
        out.append(_finish(r, user_id, Task.REDDIT, history, target,
                           history_limit=history_limit, min_history=min_history))
    return out


LOADERS: dict[str, Callable[..., list[UserRecord]]] = {
    "amazon": load_amazon,
    "news": load_lamp4,
    "reddit": load_longlamp,
}


def load_baselines(path: Path) -> dict[str, list[tuple[str, str]]]:
    """``user_id -> [(method, output), ...]`` in file order; a repeated (user, method) fails."""
    out: dict[str, list[tuple[str, str]]] = {}
    for line, prefix, rec in iter_records(Path(path)):
        r = _Reader(Path(path), line, prefix)
        user_id, method = r.text(rec, "user_id"), r.text(rec, "method")
        output = r.text(rec, "output")
        entries = out.setdefault(user_id, [])
        if any(m == method for m, _ in entries):
            raise r.fail("method", f"user {user_id!r} already has a {method!r} baseline")
        entries.append((method, output))
    return out


def load_rules(path: Path) -> dict[str, tuple[str, ...]]:
    """``user_id -> rules`` (a user's induced rubric)."""
    out: dict[str, tuple[str, ...]] = {}
    for line, prefix, rec in iter_records(Path(path)):
        r = _Reader(Path(path), line, prefix)
        user_id = r.text(rec, "user_id")
        rules = rec.get("rules")
        if not isinstance(rules, list) or not all(isinstance(x, str) and x.strip() for x in rules):
            raise r.fail("rules", "expected a list of non-empty strings")
        out[user_id] = tuple(rules)
    return out


def load_constraints(path: Path) -> dict[str, tuple[str, str]]:
    """``user_id -> (answer, preference)`` for NLICV constraint rewards."""
    out: dict[str, tuple[str, str]] = {}
    for line, prefix, rec in iter_records(Path(path)):
        r = _Reader(Path(path), line, prefix)
        out[r.text(rec, "user_id")] = (r.text(rec, "answer"), r.text(rec, "preference"))
    return out
