"""The README is a front door: under 200 lines, its two commands first, every relative link in it
and in docs/*.md resolves (the file exists; an #anchor names a heading of that file, slugged as
GitHub does), and no page links outside the repository's own files (docs stand alone)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def prose(text: str) -> str:
    """``text`` without its fenced code blocks (a link-like string in code is not a link)."""
    out, inside = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            inside = not inside
            continue
        if not inside:
            out.append(line)
    return "\n".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to -."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip())
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    heads = [line.lstrip("#").strip() for line in prose(path.read_text(encoding="utf-8")).splitlines()
             if re.match(r"#{1,6} ", line)]
    return {slug(h) for h in heads}


def links(path: Path) -> list[str]:
    return LINK.findall(prose(path.read_text(encoding="utf-8")))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    bad = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not ours to check offline
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif ROOT not in dest.parents and dest != ROOT:
            bad.append(f"{target}: outside the repository (docs must stand alone)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert bad == []


def test_no_page_points_at_the_shared_background() -> None:
    assert [p.name for p in PAGES if re.search(r"(\.\./|/work/)shared\b",
                                               p.read_text(encoding="utf-8"))] == []


def test_the_readme_is_a_front_door() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 200
    first_block = text.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert [line.split()[:2] for line in first_block] == [["make", "demo"], ["make", "test"]]
    linked = {t.partition("#")[0] for t in links(ROOT / "README.md")}
    for page in ("architecture", "api", "operations", "training", "configuration"):
        assert f"docs/{page}.md" in linked


def test_slugs_and_the_checker() -> None:
    assert slug("The main job (`make demo`)") == "the-main-job-make-demo"
    assert slug("Training runs (`trainer/run.py`)") == "training-runs-trainerrunpy"
    assert slug("Security: what listens where") == "security-what-listens-where"
    assert links_in("see [a](docs/x.md#y) and ![img](p.png) `[no](z)`") == ["docs/x.md#y"]


def links_in(text: str) -> list[str]:
    return LINK.findall(re.sub(r"`[^`]*`", "", text))
