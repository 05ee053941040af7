"""Configuration errors a person can act on: where the bad value came from, what it was, and
the nearest valid key.

:func:`reward_server.config.load_config` records an origin for every key it sets (``file:line``
for YAML, the environment variable, the ``--set`` text) and hands pydantic's errors here.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Iterator, Mapping
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

Path_ = tuple[str, ...]
_MAX_SHOWN = 80


def yaml_key_lines(text: str) -> dict[Path_, int]:
    """Line (1-based) of every mapping key of a YAML document, by key path."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return {}
    out: dict[Path_, int] = {}

    def walk(node: Any, path: Path_) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    sub = (*path, str(key.value))
                    out[sub] = key.start_mark.line + 1
                    walk(value, sub)

    walk(root, ())
    return out


def _models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _tag(model: type[BaseModel]) -> str | None:
    field = model.model_fields.get("kind")
    args = typing.get_args(field.annotation) if field is not None else ()
    return str(args[0]) if len(args) == 1 else None


def valid_paths(model: type[BaseModel], prefix: Path_ = ()) -> Iterator[Path_]:
    """Every dotted key the schema accepts (the members of a union on ``kind`` all count)."""
    for name, field in model.model_fields.items():
        path = (*prefix, name)
        yield path
        for sub in _models(field.annotation):
            yield from valid_paths(sub, path)


def _keys_at(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str] | None:
    """The field names of the model at ``loc`` (pydantic's location, union tags included)."""
    candidates: list[type[BaseModel]] = [root]
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        tagged = [m for m in candidates if _tag(m) == part]
        if tagged:
            candidates = tagged
            continue
        nxt: list[type[BaseModel]] = []
        for m in candidates:
            field = m.model_fields.get(str(part))
            if field is not None:
                nxt += _models(field.annotation)
        if not nxt:
            return None
        candidates = nxt
    if len(candidates) > 1:  # a union not yet resolved by a tag: offer the shared keys
        names = set(candidates[0].model_fields)
        for m in candidates[1:]:
            names &= set(m.model_fields)
        return sorted(names)
    return list(candidates[0].model_fields)


def _tree_path(loc: tuple[Any, ...], tree: Mapping[str, Any]) -> Path_:
    """Pydantic's location as the user's key path (union tags dropped)."""
    out: list[str] = []
    node: Any = tree
    for part in loc:
        if isinstance(node, Mapping) and part in node:
            out.append(str(part))
            node = node[part]
        elif isinstance(node, Mapping) and node.get("kind") == part:
            continue  # the discriminator's tag, not a key
        else:
            out.append(str(part))
            node = None
    return tuple(out)


def _origin(path: Path_, origins: Mapping[Path_, str]) -> str | None:
    """The layer that set ``path``, else the nearest enclosing key that some layer set or set
    something under (a missing field is reported where its section came from)."""
    for n in range(len(path), 0, -1):
        hit = origins.get(path[:n])
        if hit is not None:
            return hit
        under = sorted(k for k in origins if k[:n] == path[:n])
        if under:
            return origins[under[0]]
    return None


def _owners(path: Path_, root: type[BaseModel]) -> list[str]:
    """The ``kind`` values of the union members at ``path[:-1]`` that do have ``path[-1]``."""
    candidates: list[type[BaseModel]] = [root]
    for part in path[:-1]:
        nxt: list[type[BaseModel]] = []
        for m in candidates:
            field = m.model_fields.get(part)
            if field is not None:
                nxt += _models(field.annotation)
        candidates = nxt
    return sorted(t for m in candidates if path[-1] in m.model_fields and (t := _tag(m)))


def tree_kind(tree: Mapping[str, Any], path: Path_) -> Any:
    node: Any = tree
    for part in path:
        node = node.get(part) if isinstance(node, Mapping) else None
    return node.get("kind") if isinstance(node, Mapping) else None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def suggest(path: Path_, root: type[BaseModel], keys_here: list[str] | None) -> str | None:
    """The nearest valid key for an unknown ``path``: a sibling, the same key elsewhere, or the
    closest dotted path."""
    name = path[-1]
    if keys_here:
        close = difflib.get_close_matches(name, keys_here, n=1, cutoff=0.6)
        if close:
            return ".".join((*path[:-1], close[0]))
    every = {".".join(p) for p in valid_paths(root)}
    tail = ".".join(path[-2:]) if len(path) > 1 else name
    same = sorted(p for p in every if p.endswith("." + tail) or p == tail)
    if same:
        return same[0]
    close = difflib.get_close_matches(".".join(path), sorted(every), n=1, cutoff=0.6)
    return close[0] if close else None


def format_errors(
    error: ValidationError,
    *,
    root: type[BaseModel],
    tree: Mapping[str, Any],
    origins: Mapping[Path_, str],
) -> str:
    """One line per problem: key (from where): what is wrong; the value; the fix."""
    lines = ["invalid configuration:"]
    for err in error.errors():
        loc = tuple(err["loc"])
        path = _tree_path(loc, tree)
        where = _origin(path, origins)
        line = f"  {'.'.join(path) or '(root)'}"
        if where:
            line += f" (from {where})"
        msg = str(err["msg"])
        if err["type"] == "extra_forbidden":
            owners = _owners(path, root)
            kind = tree_kind(tree, path[:-1])
            if owners and kind not in owners:
                line += (f": not a field of kind {kind!r} (it belongs to kind "
                         f"{' / '.join(owners)}); remove it or change kind")
            else:
                line += ": unknown key"
                hint = suggest(path, root, _keys_at(root, loc[:-1]))
                if hint:
                    line += f"; did you mean {hint}?"
        else:
            line += f": {msg[0].lower() + msg[1:]}"
            if err["type"] != "missing" and "input" in err:
                line += f" (got {_shown(err['input'])})"
        lines.append(line)
    if len(lines) == 2:  # one problem, one line
        return f"{lines[0]} {lines[1].strip()}"
    return "\n".join(lines)
