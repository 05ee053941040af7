"""``reward-server serve`` with a model id the hub cannot give (here: HF_ENDPOINT on a refused
loopback port, an empty cache, HF_HUB_OFFLINE unset, as on a machine without the hub) stops
with one line naming the model and the fix, in process and with an embedded Ray (checked before
Ray starts), and no retry line. Before the check it took 54 s in process and 67 s on Ray (the
hub's 5 retries per file, for the tokenizer and the config); the bound here is generous for a
loaded 2-core machine and still far below that."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = "some-org/nli-that-is-not-here"
BOUND_S = 30.0


@pytest.mark.parametrize("ray", [False, True], ids=["in-process", "embedded-ray"])
def test_a_model_the_hub_cannot_give_fails_in_seconds_with_the_fix(tmp_path: Path, ray: bool) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "RAY_ADDRESS"))}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_CACHE=str(tmp_path / "hub"),
               RAY_TMPDIR=str(tmp_path))
    argv = [sys.executable, "-m", "reward_server", "serve", "--port", "0", "--set",
            f"engines={{judge: {{kind: fake}}, nli: {{kind: transformers, model: {MODEL}}}}}",
            *(["--ray", "--set", "serving.ray.nli.num_gpus=0"] if ray else [])]
    start = time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    took = time.monotonic() - start
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and MODEL in last and "engines.nli.model" in last, proc.stderr
    assert "HF_HUB_OFFLINE=1" in last and "local model folder" in last, last
    assert "Retrying in" not in proc.stderr  # none of the hub's retries
    assert "Started a local Ray" not in proc.stderr  # failed before Ray started
    assert took < BOUND_S, f"{took:.1f} s"


def test_a_cached_model_loads_from_its_folder_when_the_hub_cannot_be_reached(tmp_path: Path) -> None:
    """By name, the loader asked the hub for every optional file the cache lacks, 5 times each:
    a cached tiny NLI model took 94 s to load with the hub unreachable; its folder loads at once
    and the engine still reports the model's name."""
    from reward_server.backends.tiny_models import build_tiny_nli_model

    repo = tmp_path / "hub" / "models--some-org--tiny-nli"
    build_tiny_nli_model(repo / "snapshots" / ("a" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_CACHE=str(tmp_path / "hub"))
    code = ("import logging, sys\nlogging.basicConfig(level=logging.WARNING)\n"
            "from reward_server.backends.factory import build_nli\n"
            "from reward_server.backends.settings import TransformersNLISettings\n"
            "e = build_nli(TransformersNLISettings(model='some-org/tiny-nli'))\n"
            "print('model_id', e.model_id)\n")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    took = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "model_id some-org/tiny-nli" in proc.stdout
    assert "loading the cached copy" in proc.stderr and "Retrying in" not in proc.stderr
    assert took < BOUND_S, f"{took:.1f} s"
