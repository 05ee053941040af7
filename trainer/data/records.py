"""The trainer's normalized data: one :class:`UserRecord` per user, whatever the source format.

Every loader turns its format into these records; ``prepare`` turns records into verl parquet
rows and TRL datasets. Errors in input files are :class:`DataFormatError` naming file, line and
field so the fix is obvious.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reward_server.domain import HistoryItem, Task


class DataFormatError(ValueError):
    """A malformed input record. The message names the file, the line and the field."""

    def __init__(self, path: Path | str, line: int | None, field_name: str, problem: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: field {field_name!r}: {problem}")
        self.path = str(path)
        self.line = line
        self.field = field_name
        self.problem = problem

    def __reduce__(self) -> tuple[Any, ...]:
        # pickle (multiprocessing, Ray) rebuilds an exception from its args, the message alone
        return (type(self), (self.path, self.line, self.field, self.problem), self.__dict__)


@dataclass(frozen=True)
class UserRecord:
    """One user: history (oldest first), the held-out target, and what rewards need.

    ``baselines`` maps method name to that method's output on the target context (PARL's
    negatives), in file order. ``rules`` are the user's induced rubric (personalized generator
    reward); ``answer`` and ``preference`` feed NLICV constraints.
    """

    user_id: str
    task: Task
    history: tuple[HistoryItem, ...]
    target: HistoryItem
    baselines: tuple[tuple[str, str], ...] = ()
    rules: tuple[str, ...] = ()
    answer: str = ""
    preference: str = ""
    source: str = field(default="", compare=False)

    def with_extras(
        self,
        *,
        baselines: tuple[tuple[str, str], ...] | None = None,
        rules: tuple[str, ...] | None = None,
        answer: str | None = None,
        preference: str | None = None,
    ) -> UserRecord:
        return UserRecord(
            user_id=self.user_id,
            task=self.task,
            history=self.history,
            target=self.target,
            baselines=self.baselines if baselines is None else baselines,
            rules=self.rules if rules is None else rules,
            answer=self.answer if answer is None else answer,
            preference=self.preference if preference is None else preference,
            source=self.source,
        )
