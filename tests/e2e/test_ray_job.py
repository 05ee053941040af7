"""The README's training path: `ray job submit --working-dir . -- python trainer/run.py ...` on a
Ray head started from the project's environment (trainer.ray_head: `ray start --head`, token
auth, loopback node and dashboard), against a real reward server; and a job whose `python` lacks
the project's packages failing at once with the fix.

The head runs as on a new machine: ``HOME`` an empty folder and no ``RAY_AUTH_*`` variables, so
it makes its own token and hands it to every process started with its environment."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="the TRL engine needs the trl extra: pip install -e .[trl]")

from trainer.data.prepare import build_rows, sample_records, to_trl, write_parquet
from trainer.ray_head import LocalRayHead

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]


NEW_MACHINE = {"RAY_AUTH_TOKEN": None, "RAY_AUTH_TOKEN_PATH": None, "RAY_ADDRESS": None}


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):  # type: ignore[no-untyped-def]
    """A head on a new machine: an empty HOME (no ~/.ray/auth_token), no RAY_AUTH_* variables."""
    home = tmp_path_factory.mktemp("home")
    env = {**NEW_MACHINE, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"),
           "XDG_CONFIG_HOME": str(home / ".config")}
    log = tmp_path_factory.mktemp("ray_head") / "head.log"
    with LocalRayHead(num_cpus=2, log_path=log, env=env) as head:
        yield head


def test_a_new_machine_head_makes_its_own_token_and_a_job_submit_reaches_it(
    ray_head, listeners_of, loopback
) -> None:
    """Today's failure on a new machine: `ray start --head` with token auth and no token. The
    head (GCS, raylet, dashboard, agents, the job's workers) listens on loopback only."""
    token = ray_head.token_path
    assert token is not None and token.parent == ray_head.temp_dir
    assert token.stat().st_mode & 0o777 == 0o600
    secret = token.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}", secret)
    assert not (Path(ray_head.env["HOME"]) / ".ray").exists()  # nothing written to the home
    job = ray_head.submit(
        ["python", "-c", "import ray; ray.init(); print('cpus', ray.cluster_resources()['CPU'])"],
        working_dir=ROOT / "trainer" / "config", timeout_s=240)
    out = job.stdout + job.stderr
    assert job.returncode == 0, out[-4000:]
    assert "cpus 2.0" in out
    assert ray_head._proc is not None
    found = listeners_of(ray_head._proc.pid)
    assert {"gcs_server", "raylet"} <= {name for _, name, _, _ in found}, found
    assert [x for x in found if not loopback(x[2])] == []
    assert secret not in out and secret not in ray_head.log_path.read_text(errors="replace")
    line = ray_head.usage_line()
    assert "RAY_AUTH_MODE=token" in line and f"RAY_AUTH_TOKEN_PATH={token}" in line
    assert secret not in line


def test_ray_job_submit_trains_one_step_and_leaves_its_outputs(
    ray_head, reward_server, smollm2_path, tmp_path
) -> None:
    records = sample_records(history_limit=1)[:1]
    write_parquet(to_trl(build_rows(records, "personalized_generator", history_limit=1)),
                  tmp_path / "data" / "trl_train.parquet")
    entry = ["python", "trainer/run.py", "--engine", "trl", "--data", str(tmp_path / "data"),
             "--reward-server", reward_server.target, "--output-dir", str(tmp_path / "runs"),
             "--run-name", "e2e", "--model", smollm2_path, "--max-steps", "1",
             "--prompts-per-step", "1", "--num-generations", "2", "--max-completion-length", "8"]
    job = ray_head.submit(entry, working_dir=ROOT, timeout_s=480)
    out = job.stdout + job.stderr
    assert job.returncode == 0, out[-6000:]
    printed = dict(re.findall(r"^(model|run log|plot|provenance):\s+(/\S+)$", out, flags=re.M))
    run_dir = tmp_path / "runs" / "e2e"
    assert printed == {"model": str(run_dir / "model"), "run log": str(run_dir / "run_log.jsonl"),
                       "plot": str(run_dir / "reward.png"), "provenance": str(run_dir / "provenance.json")}
    assert (run_dir / "model" / "config.json").is_file()
    assert list((run_dir / "model").glob("*.safetensors"))
    assert '"reward"' in (run_dir / "run_log.jsonl").read_text()
    assert (run_dir / "reward.png").stat().st_size > 0
    assert "fake-judge" in (run_dir / "provenance.json").read_text()
    assert re.search(r"step 1/1  reward \d", out)  # the per-step line
    assert "_ray_pkg_" not in str(printed)  # not inside Ray's package cache


def test_a_job_without_the_projects_packages_fails_at_once_with_the_fix(ray_head, tmp_path) -> None:
    start = time.monotonic()
    job = ray_head.submit(
        ["python3", "trainer/run.py", "--engine", "trl", "--data", str(tmp_path),
         "--reward-server", "127.0.0.1:1"],
        working_dir=ROOT, timeout_s=180,
        runtime_env_json='{"env_vars": {"PATH": "/usr/bin:/bin", "PYTHONPATH": ""}}',
    )
    out = job.stdout + job.stderr
    assert job.returncode != 0
    assert "trainer/run.py --engine trl cannot start" in out, out[-3000:]
    assert re.search(r"lacks .*grpcio.*trl", out)
    assert "1. start the cluster from the project's environment" in out
    assert "2. run the cluster from the training image built by deploy/Dockerfile" in out
    assert "ModuleNotFoundError" not in out
    assert time.monotonic() - start < 120


@pytest.mark.parametrize("auth", [{"RAY_AUTH_MODE": None}, {"RAY_AUTH_MODE": "token",
                                                           "RAY_AUTH_TOKEN": "0" * 32}])
def test_joining_the_cluster_without_its_token_fails_in_seconds_with_the_fix(ray_head, auth) -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in ray_head.env.items()
           if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}
    env.update({k: v for k, v in auth.items() if v is not None})
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "reward_server", "serve", "--fake",
                           "--address", ray_head.address, "--port", "0"],
                          cwd=ROOT, env={**env, "PATH": os.environ["PATH"]}, capture_output=True,
                          text=True, timeout=90)
    took = time.monotonic() - start
    assert proc.returncode != 0
    err = proc.stderr
    assert "Traceback" not in err and len(re.findall(r"(?m)^error: ", err)) == 1, err[-3000:]
    assert f"the Ray cluster at {ray_head.address} refused this process" in err, err[-3000:]
    assert "export RAY_AUTH_MODE=token" in err and "RAY_AUTH_TOKEN" in err
    assert "~/.ray/auth_token" in err and "ray get-auth-token" in err
    assert took < 30  # not Ray's ~20 s of InvalidAuthToken retries before a bare ConnectionError
    assert err.count("InvalidAuthToken") <= 3


def test_the_server_token_reaches_a_job_as_a_file_and_no_listing_shows_it(ray_head, tmp_path) -> None:
    """The documented way to give a `ray job submit` job the reward server's token: the runtime
    env names the file (REWARD_SERVER_TOKEN_FILE); the job, and every worker of it, reads the
    token from there. `ray job list` shows the file's path, never the token."""
    import hashlib
    import json
    import subprocess

    token = "c0ffee" * 8
    path = tmp_path / "reward-server-token"
    path.write_text(token)
    path.chmod(0o600)
    probe = ("import hashlib, ray; from reward_server.client import bearer_token; ray.init(); "
             "f = ray.remote(lambda: hashlib.sha256(bearer_token().encode()).hexdigest()); "
             "print('driver', hashlib.sha256(bearer_token().encode()).hexdigest()); "
             "print('worker', ray.get(f.remote()))")
    job = ray_head.submit(["python", "-c", probe], working_dir=ROOT / "trainer" / "config",
                          timeout_s=240, runtime_env_json=json.dumps(
                              {"env_vars": {"REWARD_SERVER_TOKEN_FILE": str(path)}}))
    out = job.stdout + job.stderr
    assert job.returncode == 0, out[-4000:]
    digest = hashlib.sha256(token.encode()).hexdigest()
    assert f"driver {digest}" in out and f"worker {digest}" in out
    listing = subprocess.run([ray_head.ray, "job", "list", "--address", ray_head.dashboard_url],
                             env=ray_head.env, capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0, listing.stderr[-2000:]
    assert str(path) in listing.stdout  # the job's runtime env, as listed
    assert token not in listing.stdout + listing.stderr and token not in out
