"""What each engine needs installed, checked before anything else is imported (stdlib only).

A Ray job runs whatever ``python`` the Ray cluster's PATH gives it, which is often not the
project's environment; without this check such a job dies deep inside an import with a bare
``ModuleNotFoundError``.
"""

from __future__ import annotations

import importlib.util
import platform
import sys

# import name -> pip requirement, per engine (and what every engine needs)
COMMON = {"grpc": "grpcio", "google.protobuf": "protobuf", "pydantic": "pydantic", "yaml": "pyyaml"}
ENGINES = {
    "trl": {"torch": "torch", "transformers": "transformers", "trl": "trl", "datasets": "datasets",
            "accelerate": "accelerate", "matplotlib": "matplotlib", "pyarrow": "pyarrow"},
    "verl": {"torch": "torch", "ray": "ray", "verl": "verl", "transfer_queue": "TransferQueue",
             "cachetools": "cachetools", "hydra": "hydra-core", "omegaconf": "omegaconf",
             "pyarrow": "pyarrow"},
}
EXTRAS = {"trl": "trl", "verl": "train,rollout"}


def _present(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken one
        return False


def missing(engine: str) -> list[str]:
    """pip requirements of ``engine`` this interpreter cannot import."""
    need = {**COMMON, **ENGINES[engine]}
    return sorted({pip for mod, pip in need.items() if not _present(mod)})


def message(engine: str, lacking: list[str]) -> str:
    """What is missing, where, and the two ways to give a Ray job the project's environment."""
    return (
        f"trainer/run.py --engine {engine} cannot start: {sys.executable} (Python "
        f"{platform.python_version()}) lacks {', '.join(lacking)}.\n"
        "A Ray job runs the `python` on the PATH of the process that started the Ray cluster, "
        "not your shell's. Give the cluster the project's environment, either way:\n"
        "  1. start the cluster from the project's environment: `source .venv/bin/activate && "
        "ray start --head ...` (what `make demo` does), after "
        f"`pip install -e \".[{EXTRAS[engine]}]\"` there;\n"
        "  2. run the cluster from the training image built by deploy/Dockerfile "
        "(`--build-arg EXTRAS=train,rollout,trl`; deploy/kuberay/rayjob.yaml uses it)."
    )


def check(engine: str) -> str | None:
    """None when ``engine`` can run here, else the message to print."""
    lacking = missing(engine)
    return message(engine, lacking) if lacking else None
