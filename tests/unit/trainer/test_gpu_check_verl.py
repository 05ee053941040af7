"""The GPU kit's verl step (scripts/gpu_check.py): both presets through ``--check-config`` for
the GPU count found. Runs the real subprocess, so a refusal is verl's and ours, not a fake."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("verl", reason="verl is the train extra: pip install -e .[train]")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses resolve their module by name
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("gpu_check", None)
    return module


def test_overrides_follow_the_gpu_count(gpu_check: ModuleType) -> None:
    assert gpu_check.verl_overrides(0) == []  # no CUDA: the presets as shipped
    assert gpu_check.verl_overrides(4)[-1] == "actor_rollout_ref.rollout.tensor_model_parallel_size=2"
    assert gpu_check.verl_overrides(1) == ["trainer.n_gpus_per_node=1", "trainer.nnodes=1",
                                           "actor_rollout_ref.rollout.tensor_model_parallel_size=1"]


@pytest.mark.e2e  # the GPU kit's step, as the kit runs it (a subprocess per preset)
@pytest.mark.parametrize(("n_gpus", "ok"), [(1, True), (3, False)])
def test_both_presets_are_checked_for_the_gpus_found(gpu_check: ModuleType, n_gpus: int, ok: bool) -> None:
    res = gpu_check.verl_config_check(n_gpus, timeout_s=300)
    assert res["ok"] is ok and set(res["presets"]) == {"rubric_generator", "personalized_generator"}
    for p in res["presets"].values():
        if ok:
            assert p["rc"] == 0 and "is valid" in p["messages"][-1]
        else:  # 8 prompts x 5 rollouts = 40 samples do not split over 3 GPUs
            assert p["rc"] == 2
            assert any("over 3 data-parallel ranks" in m for m in p["messages"])
