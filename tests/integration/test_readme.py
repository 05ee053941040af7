"""The README's client example, and docs/api.md's PARL-A one, run as printed (against a
fake-engine server, as the README starts one) and print exactly the output they show."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
ADDRESS = "127.0.0.1:50051"
EXAMPLES = [(README, "## Calling the API\n"), (ROOT / "docs" / "api.md", "## Calling it\n")]


def client_example(path: Path = README, heading: str = "## Calling the API\n") -> tuple[str, str]:
    """(the first Python block under ``heading``, the output block after it)."""
    text = path.read_text(encoding="utf-8")
    section = text[text.index(heading):]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None, f"no python block under {heading}"
    shown = re.search(r"prints, against `serve --fake`.*?```\n(.*?)```", section[code.end():], re.S)
    assert shown is not None, "no output block after the client example"
    return code.group(1), shown.group(1)


@pytest.mark.parametrize(("path", "heading"), EXAMPLES, ids=["README", "docs/api.md"])
def test_the_client_examples_print_what_the_docs_show(reward_server: Any, path: Path,
                                                      heading: str) -> None:
    code, shown = client_example(path, heading)
    assert ADDRESS in code and "..." not in code
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code.replace(ADDRESS, reward_server.target), "README.md", "exec"), {})
    assert out.getvalue() == shown
    assert out.getvalue().startswith("ItemStatus.OK ")
