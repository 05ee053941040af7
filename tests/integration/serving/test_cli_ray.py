"""`reward-server serve` with serving.mode=ray, end to end: start (joining the session's Ray),
health SERVING, Score through gRPC -> Ray Serve -> fake engines, SIGTERM, clean exit."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from reward_server import domain as d
from reward_server.client import AsyncRewardClient

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
PREFIX = "t-cli"


def _wait_for_port(proc: subprocess.Popen[str], timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("listening on "):
            return int(line.strip().rsplit(":", 1)[1])
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"server did not start (rc={proc.poll()})")


async def test_serve_in_ray_mode_scores_and_exits_cleanly_on_sigterm(ray_session: Any) -> None:
    from ray import serve

    address = ray_session.get_runtime_context().gcs_address
    cmd = [
        sys.executable, "-m", "reward_server", "serve", "--fake", "--port", "0",
        "--address", address,
        "--set", f"serving.ray.app_prefix={PREFIX}",
        "--set", "serving.ray.judge.num_cpus=0",
        "--set", "serving.ray.nli.num_cpus=0",
        "--set", "server.grace_period_s=2",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARD_SERVER")}
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        port = await asyncio.to_thread(_wait_for_port, proc, 180)
        apps = serve.status().applications
        assert str(apps[f"{PREFIX}-judge"].status).endswith("RUNNING")
        assert str(apps[f"{PREFIX}-nli"].status).endswith("RUNNING")
        async with AsyncRewardClient(f"127.0.0.1:{port}") as client:
            assert await client.health() == "SERVING"
            items = [
                d.ScoreItem(
                    f"i{k}",
                    d.RubricScoreSpec(
                        "c", "coffee time", ('The text mentions "coffee".', f'It says "tea{k}".')
                    ),
                )
                for k in range(8)
            ]
            results = await asyncio.gather(*(client.score([it]) for it in items))
        for k, (r,) in enumerate(results):
            assert r.item_id == f"i{k}" and r.status is d.ItemStatus.OK
            assert r.reward == pytest.approx((0.98 + 0.02) / 2)  # mean p_yes: covered, not
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.to_thread(proc.wait, 60)
        assert rc == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        # joined an external cluster: the server leaves its applications there; clean up
        for kind in ("judge", "nli"):
            serve.delete(f"{PREFIX}-{kind}")
