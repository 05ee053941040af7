"""``reward-server eval nli``: NLICV over a JSONL file, confusion matrix, Table-3-shaped summary.

Input: one JSON object per line::

    {"id": "u0-q3-p",                # optional; default: the line number
     "response": "...",              # the LLM response under test (premise)
     "answer": "...",                # the correct answer a (Correct(r, a))
     "preference": "...",            # the user's preference i (Aligned(r, i))
     "regime": "personalization"}    # optional gold label: personalization | generalization |
                                     #   sycophancy | failure

Outputs in ``--out``: ``results.jsonl`` (per item: id, gold, regime, s_correct, s_aligned,
truncated, and evidence with ``--evidence``), ``summary.json`` (per-regime means and accuracy,
Mean Acc, confusion matrix gold x predicted, items/s, model id, template versions, settings) and
``confusion.png`` (a heatmap; needs matplotlib, the ``eval`` extra). The engine comes from the
config (``engines.nli``; ``--set engines.nli.kind=transformers --set engines.nli.model=...``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from reward_server.config import RewardServerConfig, load_config
from reward_server.domain import Regime, Verification
from reward_server.eval import progress_bar
from reward_server.nli.metrics import EvalSummary, format_table, summarize
from reward_server.nli.verifier import REGIME_ORDER, VerifyInput, template_versions, verify_batch

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class EvalItem:
    item_id: str
    inputs: VerifyInput
    gold: Regime | None


def register(subparsers: Any) -> None:
    """Add the ``nli`` command to an argparse subparsers object."""
    p = subparsers.add_parser("nli", help="NLICV confusion-matrix evaluation over a JSONL file")
    p.add_argument("--input", required=True, type=Path, help="items.jsonl (see module doc)")
    p.add_argument("--out", required=True, type=Path, help="output folder")
    p.add_argument("--config", "-c", type=Path, help="YAML config file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set nli.long_premise=windows")  # fmt: skip
    p.add_argument("--evidence", action="store_true", help="also compute ablation evidence")
    p.add_argument("--chunk", type=int, default=64, help="items per batched engine pass")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(fn=run_nli_eval)


def read_items(path: Path) -> list[EvalItem]:
    """Parse the JSONL input; ValueError naming the line on any malformed record."""
    items: list[EvalItem] = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                if not isinstance(rec, dict):
                    raise ValueError("not a JSON object")
                fields = [rec.get(k) for k in ("response", "answer", "preference")]
                if not all(isinstance(x, str) for x in fields):
                    raise ValueError("response, answer and preference must be strings")
                gold_raw = rec.get("regime")
                gold = Regime(str(gold_raw).strip().lower()) if gold_raw else None
            except ValueError as e:
                raise ValueError(f"{path}:{n}: {e}") from None
            response, answer, preference = (str(x) for x in fields)
            items.append(
                EvalItem(str(rec.get("id", n)), VerifyInput(response, answer, preference), gold)
            )
    return items




async def evaluate(
    items: list[EvalItem], config: RewardServerConfig, *, evidence: bool, chunk: int,
    progress: bool = True,
) -> tuple[list[Verification], EvalSummary, str]:  # fmt: skip
    """Verify every item (``chunk`` items per engine pass) and summarize; returns the model id."""
    from reward_server.serving import start_engines

    engines = start_engines(config.engines, config.serving, require=("nli",))
    nli = engines.nli
    bar = progress_bar(len(items), progress)
    results: list[Verification] = []
    start = time.perf_counter()
    try:
        for i in range(0, len(items), max(1, chunk)):
            part = items[i : i + max(1, chunk)]
            results += await verify_batch(nli, [it.inputs for it in part], config.nli, evidence=evidence)
            if bar is not None:
                bar.update(len(part))
    finally:
        if bar is not None:
            bar.close()
        await engines.close()
    seconds = time.perf_counter() - start
    return results, summarize([it.gold for it in items], results, seconds=seconds), nli.model_id


def write_heatmap(summary: EvalSummary, path: Path) -> bool:
    """Confusion-matrix heatmap (gold rows x predicted columns); False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed (extra 'eval'); no heatmap written")
        return False
    names = [r.value for r in REGIME_ORDER]
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    im = ax.imshow(summary.confusion, cmap="Blues")
    ax.set_xticks(range(4), names, rotation=30, ha="right")
    ax.set_yticks(range(4), names)
    ax.set_xlabel("predicted regime")
    ax.set_ylabel("gold regime")
    for r in range(4):
        for c in range(4):
            ax.text(c, r, str(summary.confusion[r][c]), ha="center", va="center")
    acc = "n/a" if summary.mean_acc is None else f"{100 * summary.mean_acc:.1f}%"
    ax.set_title(f"NLICV confusion matrix (Mean Acc {acc})")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def run_nli_eval(args: argparse.Namespace) -> int:
    """Entry point of ``eval nli``; 0 on success, 2 on bad input."""
    config = load_config(args.config, overrides=args.overrides)
    try:
        items = read_items(args.input)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not items:
        print(f"error: {args.input} holds no items", file=sys.stderr)
        return 2
    results, summary, model_id = asyncio.run(
        evaluate(items, config, evidence=args.evidence, chunk=args.chunk,
                 progress=not getattr(args, "no_progress", False))
    )  # fmt: skip
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    with (out / "results.jsonl").open("w", encoding="utf-8") as f:
        for it, v in zip(items, results, strict=True):
            rec: dict[str, Any] = {
                "id": it.item_id,
                "gold": it.gold.value if it.gold else None,
                "regime": v.regime.value,
                "s_correct": v.s_correct,
                "s_aligned": v.s_aligned,
                "truncated": v.truncated,
            }
            if args.evidence:
                rec["evidence"] = [dataclasses.asdict(e) for e in v.evidence]
            f.write(json.dumps(rec) + "\n")
    doc = summary.to_dict() | {
        "model_id": model_id,
        "template_versions": template_versions(config.nli),
        "settings": config.nli.model_dump(mode="json"),
    }
    (out / "summary.json").write_text(json.dumps(doc, indent=2), encoding="utf-8")
    heatmap = write_heatmap(summary, out / "confusion.png")
    print(f"NLICV on {args.input} with {model_id}")
    print(format_table(summary))
    print(f"wrote {out / 'results.jsonl'}, {out / 'summary.json'}"
          + (f", {out / 'confusion.png'}" if heatmap else ""))  # fmt: skip
    return 0
