"""Each image's extras resolve against the package index (PyPI), as deploy/Dockerfile installs
them: the reward-server image with EXTRAS=server,gpu (vLLM >=0.32 for the judge), the training
image with EXTRAS=train,rollout,trl (verl 0.9.1 and the vLLM 0.24.0 its rollouts are built for).
pip's ``--dry-run --report`` of each, both at once, started when collection finds this module
(tests/e2e/conftest.py: they resolve while the tests before it run); no package is installed.
The offline checks (verl's own metadata, the Dockerfile and Makefile naming these extras) are
tests/unit/deploy/test_image_extras.py."""

from __future__ import annotations

import json
import re

import pytest

from .conftest import IMAGES, start_resolving

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def resolved(request: pytest.FixtureRequest) -> dict[str, dict[str, str]]:
    out = {}
    for image, resolution in start_resolving(request.config).items():
        rc, stderr = resolution.wait(timeout_s=400)
        if rc != 0 and re.search(r"(?i)(connection|network|resolve host|timed out)", stderr):
            pytest.skip(f"no package index reachable: {stderr.strip().splitlines()[-1]}")
        assert rc == 0, f"{image} image ({IMAGES[image]}):\n{stderr[-3000:]}"
        report = json.loads(resolution.report.read_text())
        out[image] = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in report["install"]}
    return out


def minor(version: str) -> tuple[int, int]:
    major, minor_, *_ = (int(x) for x in re.findall(r"\d+", version)[:2])
    return major, minor_


@pytest.mark.timeout(420)
def test_the_training_image_resolves_with_verls_stack(resolved) -> None:
    got = resolved["training"]
    assert got["verl"] == "0.9.1" and got["vllm"] == "0.24.0" and got["ray"] == "2.60.0"
    assert got["transferqueue"] and got["cachetools"] and got["trl"]
    assert minor(got["transformers"]) < (5, 11)  # verl 0.9.1's bound, which vLLM 0.24 shares


@pytest.mark.timeout(420)
def test_the_reward_server_image_resolves_with_the_judges_vllm(resolved) -> None:
    got = resolved["reward-server"]
    assert minor(got["vllm"]) >= (0, 32) and got["ray"] == "2.60.0"
    assert "verl" not in got
