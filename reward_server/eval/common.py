"""What both eval commands share: arguments, JSONL input, strict JSON output, cost per item."""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The same engines as ``reward-server serve --fake``: deterministic stand-ins, not models.
FAKE_ENGINES = "engines={judge: {kind: fake}, nli: {kind: fake}}"
EXAMPLES = Path(__file__).resolve().parent / "examples"


def add_config_args(p: argparse.ArgumentParser, *, example: str) -> None:
    """--config/--set/--fake/--no-progress/--no-plot, and the shipped example in the epilog."""
    p.add_argument("--config", "-c", type=Path, help="YAML config file (engines, rubric/nli settings)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help='override a config field, e.g. --set "engines.judge={kind: transformers, '
                   'model: smollm2-local}" (repeatable)')  # fmt: skip
    p.add_argument("--fake", action="store_true",
                   help="deterministic fake engines (layout and plumbing only: NOT a model)")  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG plots")
    p.epilog = f"Input formats: docs/evaluation.md. Shipped example: {EXAMPLES / example}"
    p.formatter_class = argparse.RawDescriptionHelpFormatter


def overrides(args: argparse.Namespace) -> list[str]:
    return [*([FAKE_ENGINES] if getattr(args, "fake", False) else []), *args.overrides]


def read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) per non-blank line; ValueError naming the line otherwise."""
    rows: list[tuple[int, dict[str, Any]]] = []
    with Path(path).open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{path}:{n}: expected a JSON object")
            rows.append((n, rec))
    return rows


def json_safe(x: Any) -> Any:
    """NaN/inf (nothing to average) become null, tuples lists: strict JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_safe(v) for v in x]
    return x


def write_json(path: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """Write ``doc`` as strict JSON and return what was written, read back (what tables render)."""
    text = json.dumps(json_safe(doc), indent=2, allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


# One scheme for every eval command's --out folder: <command>_eval.json (the source of truth),
# <command>_samples.jsonl (one line per evaluated item), <command>_<figure>.png (rendered from the
# JSON). The names ``eval nli`` wrote before it followed the scheme:
OLD_NAMES = {"nli": ("summary.json", "results.jsonl", "confusion.png", "robustness.png")}


def output(out: Path, command: str, what: str) -> Path:
    """``<out>/<command>_<what>``: ``output(out, "nli", "eval.json")`` is ``out/nli_eval.json``."""
    return out / f"{command}_{what}"


def old_outputs(out: Path, command: str) -> list[Path]:
    """Files of ``command``'s earlier naming left in ``out`` (a rerun does not overwrite them)."""
    return [out / name for name in OLD_NAMES.get(command, ()) if (out / name).is_file()]


@dataclass
class Cost:
    """Wall time one evaluator spent on its items (model loading excluded)."""

    method: str
    engine: str
    items: int = 0
    seconds: float = 0.0

    @contextmanager
    def timing(self, items: int) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - start
            self.items += items

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "engine": self.engine,
            "items": self.items,
            "seconds": self.seconds,
            "s_per_item": self.seconds / self.items if self.items else math.nan,
            "items_per_s": self.items / self.seconds if self.seconds > 0 else math.nan,
        }


def num(x: Any, spec: str = ".2f", *, scale: float = 1.0, width: int = 0) -> str:
    """A table cell: ``n/a`` for None/NaN."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return f"{'n/a':>{width}}"
    return f"{scale * float(x):>{width}{spec}}"


def format_cost(costs: Sequence[dict[str, Any]]) -> str:
    """The cost-per-item table (NLICV Table 3's time columns) from the JSON's ``cost`` list."""
    width = max([len("Method"), *(len(c["method"]) for c in costs)])
    ewidth = max([len("Engine"), *(len(c["engine"]) for c in costs)])
    lines = [f"{'Method':<{width}}  {'Engine':<{ewidth}}  {'Items':>6}  {'Total s':>9}  {'s/item':>9}  {'items/s':>9}"]
    for c in costs:
        lines.append(
            f"{c['method']:<{width}}  {c['engine']:<{ewidth}}  {c['items']:>6}  {num(c['seconds'], '.3f', width=9)}"
            f"  {num(c['s_per_item'], '.4f', width=9)}  {num(c['items_per_s'], '.1f', width=9)}"
        )
    return "\n".join(lines)
