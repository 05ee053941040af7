"""The shipped eval examples are what scripts/make_eval_examples.py writes (regenerate to update)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from reward_server.eval.common import EXAMPLES

ROOT = Path(__file__).resolve().parents[3]


def test_shipped_examples_are_current(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_eval_examples.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True, cwd=ROOT)  # fmt: skip
    made = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.jsonl"))
    shipped = sorted(p.relative_to(EXAMPLES) for p in EXAMPLES.rglob("*.jsonl"))
    assert made == shipped and len(made) == 10
    for rel in made:
        assert (tmp_path / rel).read_text() == (EXAMPLES / rel).read_text(), f"{rel}: run scripts/make_eval_examples.py"
