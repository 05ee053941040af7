"""The README's client example runs as printed (against a fake-engine server, as the README
starts one) and prints exactly the output the README shows."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parents[2] / "README.md"
ADDRESS = "127.0.0.1:50051"


def client_example() -> tuple[str, str]:
    """(the Python block of "## Calling the API", the output block after it)."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Calling the API\n"):]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None, "no python block under ## Calling the API"
    shown = re.search(r"prints, against `serve --fake`.*?```\n(.*?)```", section[code.end():], re.S)
    assert shown is not None, "no output block after the client example"
    return code.group(1), shown.group(1)


def test_the_readme_client_example_prints_what_the_readme_shows(reward_server: Any) -> None:
    code, shown = client_example()
    assert ADDRESS in code and "..." not in code
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code.replace(ADDRESS, reward_server.target), "README.md", "exec"), {})
    assert out.getvalue() == shown
    assert out.getvalue().startswith("ItemStatus.OK ")
