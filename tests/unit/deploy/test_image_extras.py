"""The extras each image installs agree with the Dockerfile, the Makefile and verl 0.9.1.

deploy/Dockerfile builds the reward-server image with EXTRAS=server,gpu (vLLM >=0.32 for the
judge) and the training image with EXTRAS=train,rollout,trl (verl 0.9.1 and the vLLM 0.24.0 its
rollouts are built for); the two stacks pin incompatible transformers, hence two images
(docs/environments.md). These checks are offline: verl's own metadata, the Dockerfile and the
Makefile. The resolution against PyPI (pip ``--dry-run --report`` of each image's extras) is
end-to-end: tests/e2e/test_image_resolution.py (make test-e2e)."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[3]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
DOCKERFILE = (ROOT / "deploy" / "Dockerfile").read_text()


def extra(name: str) -> dict[str, Requirement]:
    return {Requirement(r).name.lower(): Requirement(r) for r in EXTRAS[name]}


def verl_extra(name: str) -> dict[str, Requirement]:
    out = {}
    for raw in metadata.requires("verl") or []:
        req = Requirement(raw)
        if req.marker is not None and req.marker.evaluate({"extra": name}):
            out[req.name.lower()] = req
    return out


def test_the_dockerfile_builds_the_images_these_tests_resolve() -> None:
    assert 'ARG EXTRAS=server,gpu' in DOCKERFILE
    makefile = (Path(__file__).resolve().parents[3] / "Makefile").read_text()
    assert 'deploy/images.sh build "$(IMAGE)" server,gpu' in makefile
    assert 'deploy/images.sh build "$(IMAGE_TRAIN)" train,rollout,trl' in makefile


def test_the_rollout_extra_pins_the_vllm_verl_is_built_for() -> None:
    pytest.importorskip("verl")
    ours, verls = extra("rollout")["vllm"], verl_extra("vllm")["vllm"]
    assert str(ours.specifier) == str(verls.specifier) == "==0.24.0"


def test_the_train_extra_has_what_verls_trainer_imports_beyond_its_base() -> None:
    pytest.importorskip("verl")
    core, train = verl_extra("verl-core"), extra("train")
    assert str(train["verl"].specifier) == "==0.9.1"
    for name in ("transferqueue", "cachetools", "pyzmq"):  # TaskRunnerV1.run, router, checkpoint engines
        assert name in core and name in train, name
