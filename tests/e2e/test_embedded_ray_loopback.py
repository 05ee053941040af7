"""What the embedded Ray exposes: `reward-server serve --ray` on a new machine (empty HOME, no
RAY_AUTH_* variables) starts its own Ray whose every listener is on loopback, but one that Ray
Serve 2.60 hard-codes: each replica's inter-deployment gRPC server on ``[::]:0``
(``ray/serve/_private/replica.py``), guarded by Ray's token auth (the README's security section
says so)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]  # a Ray head of its own
REPO = Path(__file__).resolve().parents[2]


def test_the_embedded_ray_listens_on_loopback_only(tmp_path, listeners_of, loopback) -> None:  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_", "REWARD_SERVER"))}
    env.update(HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / ".cache"),
               XDG_CONFIG_HOME=str(tmp_path / ".config"))
    cmd = [sys.executable, "-m", "reward_server", "serve", "--fake", "--ray", "--port", "0",
           "--set", "serving.ray.local_num_cpus=1", "--set", "serving.ray.judge.num_cpus=0",
           "--set", "serving.ray.nli.num_cpus=0", "--set", "server.grace_period_s=1"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on 127.0.0.1:" in line, line
        time.sleep(2)  # the agents bind as they come up
        found = listeners_of(proc.pid)
        names = {name for _, name, _, _ in found}
        assert {"gcs_server", "raylet"} <= names, found  # Ray's own, and so seen by the check
        exposed = [x for x in found if not loopback(x[2])]
        hard_coded = [x for x in exposed if x[1].startswith("ray::ServeReplica") and x[2] == "::"]
        assert exposed == hard_coded, f"listening beyond loopback: {exposed}"
        assert len(hard_coded) <= 2  # one per replica (judge, NLI)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
