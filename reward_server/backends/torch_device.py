"""Device, dtype and thread choices shared by the torch engines (torch imported on call)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


def resolve_device(device: str) -> str:
    """``auto``: cuda when available, else cpu; anything else unchanged."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """``auto``: bfloat16 on GPU, float32 on CPU."""
    import torch

    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def set_threads(n: int | None) -> None:
    """torch intra-op threads for this process (None: leave torch's default)."""
    if n is not None:
        import torch

        torch.set_num_threads(n)
        logger.info("torch intra-op threads set to %d", n)
