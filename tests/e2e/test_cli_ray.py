"""`reward-server serve` with serving.mode=ray, end to end: start (joining the session's Ray),
health SERVING, Score through gRPC -> Ray Serve -> fake engines, SIGTERM, clean exit; on exit
the ingress deletes the applications it deployed unless told to keep them, never those it
attached to, and says which; its log carries only its own lines."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from reward_server import domain as d
from reward_server.client import AsyncRewardClient

# e2e: each test starts `reward-server serve` (or start_app) as a process of its own that
# joins the session's Ray and deploys its own Serve applications (~10-20 s each here)
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PREFIX = "t-cli"


class Ingress:
    """`reward-server serve --fake` joining the session's Ray, its output read as it comes."""

    def __init__(self, address: str, prefix: str, overrides: Sequence[str] = ()) -> None:
        cmd = [sys.executable, "-m", "reward_server", "serve", "--fake", "--port", "0",
               "--address", address, "--set", f"serving.ray.app_prefix={prefix}",
               "--set", "serving.ray.judge.num_cpus=0", "--set", "serving.ray.nli.num_cpus=0",
               "--set", "server.grace_period_s=2"]
        for o in overrides:
            cmd += ["--set", o]
        env = {k: v for k, v in os.environ.items() if not k.startswith("REWARD_SERVER")}
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(s, b), daemon=True)
                         for s, b in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for t in self._readers:
            t.start()

    @staticmethod
    def _read(stream: Any, into: list[str]) -> None:
        for line in stream:
            into.append(line)

    def wait_for(self, lines: list[str] | None, text: str, timeout_s: float) -> str:
        """The first line holding ``text``, in ``lines`` (None: stdout and stderr)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(lines) if lines is not None else [*self.out, *self.err]:
                if text in line:
                    return line
            if self.proc.poll() is not None and not any(t.is_alive() for t in self._readers):
                break
            time.sleep(0.1)
        raise AssertionError(f"no {text!r} within {timeout_s}s (rc={self.proc.poll()}); "
                             f"stderr tail: {''.join(self.err[-20:])}")

    def port(self) -> int:
        line = self.wait_for(self.out, "listening on ", 180)
        return int(line.strip().rsplit(":", 1)[1])

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(60)
        for t in self._readers:
            t.join(10)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    @property
    def stderr(self) -> str:
        return "".join(self.err)

    @property
    def output(self) -> str:
        return "".join(self.out) + "".join(self.err)


def app_statuses(prefix: str) -> dict[str, str]:
    from ray import serve

    apps = serve.status().applications
    return {k: str(apps[f"{prefix}-{k}"].status).rsplit(".", 1)[-1]
            for k in ("judge", "nli") if f"{prefix}-{k}" in apps}


async def test_serve_in_ray_mode_scores_and_exits_cleanly_on_sigterm(ray_session: Any) -> None:
    address = ray_session.get_runtime_context().gcs_address
    ingress = Ingress(address, PREFIX)
    try:
        port = await asyncio.to_thread(ingress.port)
        assert app_statuses(PREFIX) == {"judge": "RUNNING", "nli": "RUNNING"}
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
        assert await asyncio.to_thread(ingress.stop) == 0
    finally:
        ingress.kill()
    # it deployed them (serving.ray.deploy defaults to true): gone with it, and it says so
    assert app_statuses(PREFIX) == {}
    assert (f"deleted the Serve applications this ingress deployed: {PREFIX}-judge, {PREFIX}-nli"
            in ingress.stderr), ingress.stderr[-3000:]
    # the engine calls' handles route on the server's loop: they stop with it, quietly
    assert "has been disabled" not in ingress.stderr, ingress.stderr[-3000:]


async def test_kept_and_attached_apps_stay_and_the_log_is_the_servers_own(ray_session: Any) -> None:
    """An ingress told to keep its applications leaves them RUNNING; one attached to them
    (deploy=false) never deletes them; and a line printed by another job's Ray worker reaches
    only an ingress that asked for Ray's worker output (serving.ray.log_to_driver=true)."""
    from ray import serve

    prefix = "t-keep"
    address = ray_session.get_runtime_context().gcs_address

    @ray_session.remote(num_cpus=0)
    def shout(line: str) -> None:
        print(line, flush=True)

    keeper = Ingress(address, prefix, ["serving.ray.keep_apps_on_exit=true",
                                       "serving.ray.log_to_driver=true"])
    attached: Ingress | None = None
    try:
        await asyncio.to_thread(keeper.port)
        attached = Ingress(address, prefix, ["serving.ray.deploy=false"])
        port = await asyncio.to_thread(attached.port)
        async with AsyncRewardClient(f"127.0.0.1:{port}") as client:
            assert await client.health() == "SERVING"
        markers = [f"another job's worker says {uuid.uuid4().hex}" for _ in range(2)]
        for m in markers:  # the second reaching the keeper means the first reached everyone
            await asyncio.to_thread(ray_session.get, shout.remote(m))
            await asyncio.to_thread(keeper.wait_for, None, m, 60)
        assert await asyncio.to_thread(attached.stop) == 0
        assert not any(m in attached.output for m in markers), attached.output[-3000:]
        assert "ServeController pid=" not in attached.output  # nor Serve's, of the test's job
        assert (f"left the attached Serve applications running (serving.ray.deploy=false never "
                f"deletes): {prefix}-judge, {prefix}-nli") in attached.stderr
        assert app_statuses(prefix) == {"judge": "RUNNING", "nli": "RUNNING"}

        assert await asyncio.to_thread(keeper.stop) == 0
        assert (f"leaving the Serve applications this ingress deployed RUNNING: {prefix}-judge, "
                f"{prefix}-nli (serving.ray.keep_apps_on_exit=true") in keeper.stderr
        assert app_statuses(prefix) == {"judge": "RUNNING", "nli": "RUNNING"}
    finally:
        keeper.kill()
        if attached is not None:
            attached.kill()
        for kind in ("judge", "nli"):
            serve.delete(f"{prefix}-{kind}")


STOP_THEN_WAIT = """
import asyncio, gc, sys
import ray
from ray.serve._private.long_poll import LongPollClient
from reward_server import domain as d
from reward_server.app import start_app
from reward_server.client import AsyncRewardClient
from reward_server.config import load_config

async def main() -> None:
    app = await start_app(load_config(overrides=[
        "server.port=0", "server.drain_delay_s=0", "engines={judge: {kind: fake}, nli: {kind: fake}}",
        "serving.mode=ray", "serving.ray.address=" + sys.argv[1], "serving.ray.app_prefix=" + sys.argv[2],
        "serving.ray.judge.num_cpus=0", "serving.ray.nli.num_cpus=0"], env={}))
    async with AsyncRewardClient(app.target) as client:
        items = [d.ScoreItem(f"i{k}", d.NliConstraintsSpec("Paris is big.", "Paris", "big"))
                 for k in range(4)]
        assert all(r.status is d.ItemStatus.OK for r in await client.score(items))
    await app.stop(grace=1.0, drain_delay=0)
    polling = [c.client_id for c in gc.get_objects() if isinstance(c, LongPollClient) and c.is_running]
    print("long polls running after stop:", polling, flush=True)
    await asyncio.sleep(float(sys.argv[3]))  # the loop lives on, as in a notebook or a test
    print("ray initialized after stop:", ray.is_initialized(), flush=True)

asyncio.run(main())
"""


def test_a_stopped_app_leaves_no_ray_behind_on_a_loop_that_lives_on(ray_session: Any) -> None:
    """start_app on Ray, calls, stop, then the process's loop runs on: Serve's long-poll
    client of the engine calls' routers used to poll again after Ray had stopped, and Ray's
    auto-init started a new local Ray (dashboard included) with "Can't find actor"
    tracebacks."""
    address = ray_session.get_runtime_context().gcs_address
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARD_SERVER")}
    out = subprocess.run([sys.executable, "-c", STOP_THEN_WAIT, address, "t-stopwait", "6"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ray initialized after stop: False" in out.stdout, out.stdout + out.stderr[-3000:]
    # a poll left running (the router thread's too) can restart Ray or end the process
    assert "long polls running after stop: []" in out.stdout, out.stdout
    assert "Can't find actor" not in out.stderr, out.stderr[-3000:]
    assert "Started a local Ray instance" not in out.stderr, out.stderr[-3000:]
    assert app_statuses("t-stopwait") == {}
