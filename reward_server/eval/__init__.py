"""Offline evaluations (``reward-server eval parl | nli``): the papers' tables from files.

Entry points at the top of the layering: they load a configuration, start the engines through
the hosting API and call the science's metrics.
"""

from __future__ import annotations

import sys
from typing import Any


def progress_bar(total: int, enabled: bool, *, unit: str = "item") -> Any:
    """A tqdm bar on stderr (None without tqdm); shared by the CLI's long commands."""
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm ships with the server extra
        return None
    return tqdm(total=total, unit=unit, file=sys.stderr, disable=not enabled)
