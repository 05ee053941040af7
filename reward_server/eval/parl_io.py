"""Input files of ``reward-server eval parl`` (formats in docs/evaluation.md)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reward_server.domain import HistoryItem, Task
from reward_server.eval.common import read_jsonl

TASKS = ", ".join(t.value for t in Task)


@dataclass(frozen=True)
class UserRubric:
    rules: tuple[str, ...]
    task: Task


@dataclass(frozen=True)
class Sample:
    key: tuple[str, str]  # (user_id, sample_id)
    context: str
    text: str


def _user_id(path: Path, n: int, rec: dict[str, object]) -> str:
    uid = rec.get("user_id")
    if not isinstance(uid, str | int) or isinstance(uid, bool):
        raise ValueError(f"{path}:{n}: expected an object with a user_id (string)")
    return str(uid)


def _task(path: Path, n: int, raw: object) -> Task:
    try:
        return Task(str(raw))
    except ValueError:
        raise ValueError(f"{path}:{n}: task {raw!r} is not one of {TASKS}") from None


def read_rubrics(path: Path) -> dict[str, UserRubric]:
    """``{"user_id", "rules": [str], "task"?}`` per line; ``rules`` may be empty (not covered)."""
    out: dict[str, UserRubric] = {}
    for n, rec in read_jsonl(path):
        uid = _user_id(path, n, rec)
        rules = rec.get("rules", [])
        if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
            raise ValueError(f"{path}:{n}: user {uid}: rules must be a list of strings")
        out[uid] = UserRubric(tuple(rules), _task(path, n, rec.get("task", "generic")))
    return out


def read_predictions(path: Path) -> list[Sample]:
    """``{"user_id", "text", "context"?, "sample_id"?}`` per line; ``sample_id`` defaults to the
    user's n-th line in the file (0, 1, ...), so methods pair up line by line per user."""
    seen: dict[str, int] = {}
    samples: list[Sample] = []
    keys: set[tuple[str, str]] = set()
    for n, rec in read_jsonl(path):
        uid = _user_id(path, n, rec)
        if not isinstance(rec.get("text"), str):
            raise ValueError(f"{path}:{n}: user {uid}: text must be a string")
        sid = str(rec.get("sample_id", seen.get(uid, 0)))
        seen[uid] = seen.get(uid, 0) + 1
        if (uid, sid) in keys:
            raise ValueError(f"{path}:{n}: user {uid} has sample_id {sid!r} twice")
        keys.add((uid, sid))
        samples.append(Sample((uid, sid), str(rec.get("context", "")), rec["text"]))
    return samples


def read_history(path: Path) -> dict[str, tuple[HistoryItem, ...]]:
    """``{"user_id", "history": [{"context", "text"}, ...]}`` per line (oldest first)."""
    out: dict[str, tuple[HistoryItem, ...]] = {}
    for n, rec in read_jsonl(path):
        uid = _user_id(path, n, rec)
        items = rec.get("history")
        if not isinstance(items, list) or not all(
            isinstance(h, dict) and isinstance(h.get("text"), str) and isinstance(h.get("context", ""), str)
            for h in items
        ):
            raise ValueError(f"{path}:{n}: user {uid}: history must be a list of {{context, text}} strings")
        out[uid] = tuple(HistoryItem(str(h.get("context", "")), h["text"]) for h in items)
    return out


def read_methods(predictions: Path, gt: str) -> dict[str, list[Sample]]:
    """Every ``<method>.jsonl`` of the folder; ValueError without ``<gt>.jsonl``."""
    files = sorted(predictions.glob("*.jsonl"))
    if not any(f.stem == gt for f in files):
        raise ValueError(f"{predictions} has no {gt}.jsonl (the ground truth; --gt names it)")
    return {f.stem: read_predictions(f) for f in files}
