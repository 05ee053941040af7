"""Offline evaluations (``reward-server eval parl | nli``): the papers' comparison tables from files.

Entry points at the top of the layering: they load a configuration, start the engines through
the hosting API and call the science's metrics and baselines (docs/evaluation.md).

- ``parl`` (inputs ``parl_io``, JSON/table/plot ``parl_report``), ``nli`` (``nli_report``);
- ``classic``: ROUGE/BLEU/METEOR/BERTScore/embedding cosine from their libraries;
- ``perturb`` and ``robustness``: NLICV Table 1's seeded synonym perturbation and its table;
- ``common`` (arguments, JSONL, strict JSON, cost per item) and ``plots``.
"""

from __future__ import annotations

import sys
from typing import Any


def progress_bar(total: int, enabled: bool, *, unit: str = "item", desc: str | None = None) -> Any:
    """A tqdm bar on stderr (None without tqdm); shared by the CLI's long commands."""
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm ships with the server extra
        return None
    return tqdm(total=total, unit=unit, desc=desc, file=sys.stderr, disable=not enabled)
