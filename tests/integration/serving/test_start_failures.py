"""Ray-side start failures end `serve` within seconds, in one line, with the cause: a model that
cannot load on its replica, a replica no node can hold, an engine that crashes at start.

Serve would retry a failing replica 3 times (each retry loading the model again) and then
raise a 60-line traceback ending ``Deploying application reward-judge failed``; the replica's
exception was only in Ray's ``worker-*.err``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from reward_server.backends.base import JudgeEngine
from reward_server.backends.settings import JudgeSettings
from reward_server.errors import BackendUnavailable

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[3]


def serve(*args: str, home: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("REWARD_SERVER", "RAY_ADDRESS"))}
    env.update({"HOME": str(home), "HF_HUB_OFFLINE": "1"})  # no download at test time
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "reward_server", "serve", "--port", "0", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    return proc, time.monotonic() - start


def one_error_line(err: str) -> str:
    assert "Traceback" not in err, err[-4000:]
    lines: list[str] = re.findall(r"(?m)^error: .*$", err)
    assert len(lines) == 1, err[-4000:]
    return lines[0]


@pytest.mark.e2e  # serve on a new machine: an embedded Ray head of its own
def test_a_model_that_cannot_load_ends_serve_with_one_line_naming_it(tmp_path: Path) -> None:
    proc, took = serve("-c", "deploy/cpu_local.yaml", "--set", "engines.judge.model=no-such-model",
                       home=tmp_path)
    assert proc.returncode == 1, proc.stderr[-4000:]
    line = one_error_line(proc.stderr)
    assert "Serve deployment reward-judge/JudgeDeployment (model no-such-model) could not start a "\
           "replica" in line, line
    # the model, the setting that named it and the fix (a local folder, or the hub's cache offline)
    assert re.search(r"ModelLoadError: cannot load 'no-such-model' \(engines\.judge\.model\): .*"
                     r"Fix: set engines\.judge\.model to a local model folder", line), line
    assert re.search(r"replica log: /\S+/serve/replica_reward-judge_JudgeDeployment_\w+\.log", line), line
    assert re.search(r"Serve deployment reward-judge/JudgeDeployment \(model no-such-model\): "
                     r"0 of 1 replicas up", proc.stderr)  # progress while it started
    assert took < 120, took  # a bound, not a benchmark: Serve's own retries took 2 min 40 s


@pytest.mark.e2e  # serve on a new machine: an embedded Ray head of its own
def test_a_replica_no_node_can_hold_ends_serve_at_once(tmp_path: Path) -> None:
    proc, _ = serve("--fake", "--ray", "--set", "serving.ray.local_num_gpus=0",
                    "--set", "serving.ray.judge.num_gpus=1", home=tmp_path)
    assert proc.returncode == 1, proc.stderr[-4000:]
    line = one_error_line(proc.stderr)
    assert "Serve deployment reward-judge/JudgeDeployment (model fake-judge) cannot be placed" in line
    assert "GPU: needs 1, cluster has 0" in line and "serving.ray.judge.num_gpus" in line, line
    # the embedded Ray's token, made before Ray starts: the user's alone (Ray writes it 0644)
    token = tmp_path / ".ray" / "auth_token"
    assert token.stat().st_mode & 0o777 == 0o600 and token.parent.stat().st_mode & 0o777 == 0o700


def crashing(how: str) -> Any:
    """A replica-side judge factory that fails at start (a closure: pickled by value, as the
    replica cannot import this test module)."""

    def make(settings: JudgeSettings) -> JudgeEngine:
        if how == "raise":
            raise RuntimeError(f"engine {settings.kind} crashed at start: CUDA error: out of memory")
        os._exit(3)  # the replica's process dies while its engine starts

    return make


@pytest.mark.parametrize(("factory", "cause"), [
    ("raise", r"RuntimeError: engine fake crashed at start: CUDA error: out of memory"),
    ("exit", r"(?i)actor|died|exit"),
])
def test_an_engine_that_crashes_at_start_is_named_with_its_exception(
        ray_session: Any, kit: Any, factory: Any, cause: str) -> None:
    config = kit.config("t-crash")
    start = time.monotonic()
    with pytest.raises(BackendUnavailable) as e:
        kit.start(config, judge_factory=crashing(factory), nli_factory=kit.nli_factory())
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("Serve deployment t-crash-judge/JudgeDeployment (model fake-judge) "
                          "could not start a replica"), msg
    assert re.search(cause, msg), msg
    assert time.monotonic() - start < 120
    from ray import serve

    apps = serve.status().applications
    assert "t-crash-judge" not in apps and "t-crash-nli" not in apps  # cleaned up
