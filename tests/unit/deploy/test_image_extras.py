"""The extras the images install resolve to one environment, and agree with verl 0.9.1.

deploy/Dockerfile builds the reward-server image with EXTRAS=server,gpu and the training image
(which also runs the reward server) with EXTRAS=server,gpu,train: vLLM's and verl's stacks in one
environment. The offline checks read verl's own metadata; the resolution asks pip (PyPI) for
``--dry-run --report`` of server,gpu,train, the superset (any subset resolves with it)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[3]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def extra(name: str) -> dict[str, Requirement]:
    return {Requirement(r).name.lower(): Requirement(r) for r in EXTRAS[name]}


def verl_extra(name: str) -> dict[str, Requirement]:
    out = {}
    for raw in metadata.requires("verl") or []:
        req = Requirement(raw)
        if req.marker is not None and req.marker.evaluate({"extra": name}):
            out[req.name.lower()] = req
    return out


def test_the_gpu_extra_pins_the_vllm_verl_is_built_for() -> None:
    pytest.importorskip("verl")
    ours, verls = extra("gpu")["vllm"], verl_extra("vllm")["vllm"]
    assert str(ours.specifier) == str(verls.specifier) == "==0.24.0"


def test_the_train_extra_has_what_verls_trainer_imports_beyond_its_base() -> None:
    pytest.importorskip("verl")
    core, train = verl_extra("verl-core"), extra("train")
    assert str(train["verl"].specifier) == "==0.9.1"
    for name in ("transferqueue", "cachetools", "pyzmq"):  # TaskRunnerV1.run, router, checkpoint engines
        assert name in core and name in train, name


def test_the_servers_transformers_range_fits_verls() -> None:
    pytest.importorskip("verl")
    base = {Requirement(r).name.lower(): Requirement(r) for r in metadata.requires("verl") or []
            if "extra ==" not in r}
    ours, verls = extra("server")["transformers"].specifier, base["transformers"].specifier
    assert "<5.11" in str(ours) and "<5.11" in str(verls)  # the same upper bound
    installed = metadata.version("transformers")
    assert ours.contains(installed) and verls.contains(installed)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_training_image_extras_resolve_together() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--report", "-", f"{ROOT}[server,gpu,train]"],
        capture_output=True, text=True, timeout=400,
    )
    if proc.returncode != 0 and re.search(r"(?i)(connection|network|resolve host|timed out)", proc.stderr):
        pytest.skip(f"no package index reachable: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    got = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in report["install"]}
    assert got["verl"] == "0.9.1" and got["vllm"] == "0.24.0" and got["ray"] == "2.60.0"
    assert got["transferqueue"] and got["cachetools"]
    major, minor = (int(x) for x in got["transformers"].split(".")[:2])
    assert (major, minor) < (5, 11)  # verl 0.9.1's bound, which vLLM 0.24 shares
