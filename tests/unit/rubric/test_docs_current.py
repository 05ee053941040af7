"""docs/parl.md's exactness table was measured with the judge template in force: its recorded
template and digest must be the default's (change the template, rerun the bench, update the table)."""

from __future__ import annotations

import re
from pathlib import Path

from reward_server.rubric.templates import DEFAULT_TEMPLATE, template_digest

DOC = Path(__file__).resolve().parents[3] / "docs" / "parl.md"
LINE = re.compile(r"measured with judge template `(?P<template>[a-z0-9-]+)` \(digest `(?P<digest>[0-9a-f]{12})`\)")


def test_exactness_table_matches_the_default_template() -> None:
    found = LINE.search(DOC.read_text(encoding="utf-8"))
    assert found is not None, f"{DOC}: the exactness table must say which judge template it was measured with"
    recorded = (found["template"], found["digest"])
    current = (DEFAULT_TEMPLATE, template_digest(DEFAULT_TEMPLATE))
    assert recorded == current, (
        f"docs/parl.md's exactness table was measured with template {recorded}, the default is now {current}: "
        "rerun bench/judge_exactness.py (it prints the line to record) and update the table"
    )
