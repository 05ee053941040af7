"""Every dotted config path the project names resolves in :class:`RewardServerConfig`.

Messages and docs tell users what to set (``service.admission.max_judgments_in_flight``,
``serving.ray.judge.max_replicas``); a path typed by hand goes stale when a field moves. This
reads every string literal of reward_server/ and trainer/ (f-strings too) and every *.md of the
repository (README, docs/), picks out the paths that start with a config section, and resolves
each against the pydantic model tree: nested models, unions (``engines.judge`` is one of several
engine settings: a field of any of them counts), and dicts (anything below one counts).

Placeholders (``<kind>``, ``{kind}``, an f-string's ``{w.kind}``, ``*``): at a level that has a
block per engine (``engines``, ``serving.ray``) one stands for each engine (the fields of
``engines``: judge, nli) and every expansion must resolve; elsewhere, for some field of that
level. So ``serving.ray.<kind>.num_gpus`` resolves and ``serving.{kind}.max_replicas`` does not.
"""

from __future__ import annotations

import ast
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from reward_server.config import RewardServerConfig

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = tuple(RewardServerConfig.model_fields)
# the engines: the fields of ``engines``, and of each level that has a block per engine
ROLES = tuple(RewardServerConfig.model_fields["engines"].annotation.model_fields)  # type: ignore[union-attr]
SEGMENT = r"(?:[a-z_][a-z0-9_]*|<[a-z_]+>|\{[a-z_.]+\}|\*)"
PATH = re.compile(
    r"(?<![\w./\-{<])(?:" + "|".join(SECTIONS) + r")(?:\." + SEGMENT + r")+(?![\w(\-/])"
)
FILE_SUFFIXES = {"py", "md", "yaml", "yml", "json", "jsonl", "txt", "png", "proto", "sh"}
# Dotted names that start like a section but are not config paths: what they are instead.
NOT_CONFIG = {
    # keys of Info's template_versions and settings (provenance), not fields
    "rubric.judge", "rubric.generator", "rubric.template_digest", "rubric.parser",
    "rubric.induction_validation", "rubric.threshold_rule", "rubric.holistic",
    "rubric.rule_bounds", "nli.constraints", "nli.templates_sha256", "engines.fake",
    "service.admission.scope",  # what the forwarding ingress adds (rpc/forwarding.py)
    "service.name",  # OpenTelemetry's resource attribute (reward_server/tracing.py)
}


def _annotation_models(annotation: object) -> tuple[list[type[BaseModel]], bool]:
    """(the models an annotation can hold, whether it can hold a dict)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _annotation_models(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        models: list[type[BaseModel]] = []
        is_dict = False
        for arg in typing.get_args(annotation):
            m, d = _annotation_models(arg)
            models += m
            is_dict = is_dict or d
        return models, is_dict
    if origin in (dict, typing.Mapping) or annotation is dict:
        return [], True
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation], False
    return [], False


def _is_placeholder(segment: str) -> bool:
    return segment == "*" or segment[:1] in "<{"


def _resolves(models: list[type[BaseModel]], segments: list[str]) -> bool:
    """Some model of ``models`` has the path ``segments`` (placeholders: see the module doc)."""
    if not segments:
        return True
    head, rest = segments[0], segments[1:]
    for model in models:
        fields = model.model_fields
        if _is_placeholder(head):
            per_engine = set(ROLES) <= set(fields)
            names = list(ROLES) if per_engine else list(fields)
            found = [_field_resolves(fields[n].annotation, rest) for n in names]
            if all(found) if per_engine else any(found):
                return True
        elif head in fields and _field_resolves(fields[head].annotation, rest):
            return True
    return False


def _field_resolves(annotation: object, rest: list[str]) -> bool:
    sub, is_dict = _annotation_models(annotation)
    if is_dict:
        return True
    return not rest or (bool(sub) and _resolves(sub, rest))


def resolves(path: str) -> bool:
    """``path`` names a field of the config tree."""
    return _resolves([RewardServerConfig], re.findall(r"<[^>]*>|\{[^}]*\}|[^.]+", path))


def _literal_text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                parts.append(str(v.value))
            else:
                assert isinstance(v, ast.FormattedValue)
                parts.append("{" + ast.unparse(v.value) + "}")
        return "".join(parts)
    return None


def sources() -> Iterator[tuple[str, int, str]]:
    """(file, line, text) of every string literal in reward_server/ and trainer/ and every line
    of every *.md file."""
    for pkg in ("reward_server", "trainer"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "_proto" in path.parts:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
            for node in ast.walk(tree):
                if isinstance(parents.get(node), ast.JoinedStr):
                    continue  # a piece of an f-string: read with the whole
                text = _literal_text(node)
                if text:
                    yield str(path.relative_to(ROOT)), getattr(node, "lineno", 0), text
    for path in sorted(ROOT.rglob("*.md")):
        rel = path.relative_to(ROOT)
        if rel.parts[0].startswith(".") or "node_modules" in rel.parts:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            yield str(rel), n, line


def named_paths() -> Iterator[tuple[str, str]]:
    """(where, path) of each config path named."""
    for where, line, text in sources():
        for m in PATH.finditer(text):
            path = m.group(0).rstrip(".")
            if path.rsplit(".", 1)[-1] in FILE_SUFFIXES or path in NOT_CONFIG:
                continue
            yield f"{where}:{line}", path


def test_every_config_path_named_in_code_and_docs_resolves() -> None:
    found = list(named_paths())
    assert len(found) > 100  # the scan does see the project's messages and docs
    stale = sorted({f"{where}: {path}" for where, path in found if not resolves(path)})
    assert stale == []


@pytest.mark.parametrize(("path", "ok"), [
    ("service.admission.max_judgments_in_flight", True),
    ("serving.ray.<kind>.max_replicas", True),
    ("engines.{kind}.batching.wait_ms", True),
    ("engines.judge.model", True),  # a field of some of the judge's engine kinds
    ("serving.ray.judge.env_vars.HF_HUB_OFFLINE", True),  # below a dict
    ("server.*", True),
    ("engines.{self._name}", True),
    ("serving.judge.max_replicas", False),  # under serving.ray
    ("serving.call_timeout_s", False),
    ("serving.ray.<kind>.address", False),  # address is serving.ray's, not each engine's
    ("engines.judge.batching.wait_ms.x", False),  # below a number
])
def test_the_resolver_tells_real_paths_from_stale_ones(path: str, ok: bool) -> None:
    assert resolves(path) is ok


def test_the_scanner_finds_paths_in_prose_and_fstrings_but_not_module_names() -> None:
    text = ("set `serving.ray.judge.max_replicas`, see reward_server.serving.start and "
            "rubric/templates.py, docs/nli.md; serving.start_engines(x)")
    assert [m.group(0) for m in PATH.finditer(text)] == ["serving.ray.judge.max_replicas"]
    node = ast.parse('f"serving.{kind}.max_replicas={n}"').body[0].value  # type: ignore[attr-defined]
    assert [m.group(0) for m in PATH.finditer(_literal_text(node) or "")] == [
        "serving.{kind}.max_replicas"]
