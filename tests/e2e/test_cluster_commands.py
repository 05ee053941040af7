"""The cluster path as written: the manifests' own command lines, run on this machine, with Ray
token auth and the reward server's bearer token on.

Every command is read from the manifests (not re-typed): ``deploy/ray_cluster.yaml``'s head
and worker start lines (``deploy/commands.sh head``, ``serve-deploy``, ``ingress``;
``worker``, ``ingress``), the ingress pods' command of ``deploy/kuberay/rayservice.yaml``
(``deploy/commands.sh ingress-node``) and the RayJob's entrypoint of
``deploy/kuberay/rayjob.yaml``. What this machine changes, and nothing else:

- host paths: the install root ``/home/ray/reward-server`` is this checkout; the config the
  manifests mount at ``/etc/reward-server/config.yaml`` is a copy of
  ``deploy/reward_server_config.yaml`` in a temp dir (``REWARD_SERVER_CONFIG``), the Serve
  config a copy of ``deploy/serve_config.yaml`` (``SERVE_CONFIG``) whose ``args.config`` points
  at it; the RayJob's ``--output-dir`` is a temp dir;
- engine kinds: ``fake`` in both copies (the overrides naming vLLM/transformers models and their
  GPU options are dropped with them), and the replicas' ``ray_actor_options`` to 0.25 CPU and
  no GPU (no GPU here);
- the node layout: ray up's autoscaler config (``--autoscaling-config``) is dropped (no
  autoscaler here); the head gets ``--num-cpus=0`` (ray up's ``resources: {CPU: 0}``), the worker
  ``--num-cpus=2`` (a GPU worker's ``resources``); several nodes share this machine, so each
  gets its own ``--temp-dir`` and free ports (appended flags; ``ray start`` takes the last),
  ``RAY_PORT``, ``RAY_HEAD_IP`` (what ``ray up`` sets on workers), ``RAY_HEAD_ADDRESS`` (the
  KubeRay manifest's Service name becomes 127.0.0.1), and the ingresses listen on 127.0.0.1 at
  ports the OS picks (``REWARD_SERVER_HOST`` / ``REWARD_SERVER_PORT``, ``REWARD_SERVER__SERVER__*``
  at 0, read back from their logs); an
  ingress on a node that is not the head is told its node (``serving.ray.node_temp_dir``,
  several nodes on one host); ``nohup ... &`` runs in the foreground so the test holds it;
- the trainer: the RayJob's entrypoint with ``--engine trl`` (verl needs GPUs) and the local
  SmolLM2 for 1 step instead of verl's Hydra overrides, ``--reward-server`` (and
  ``REWARD_SERVER_ADDRESS``) the three ingresses instead of the headless Service, submitted with
  ``ray job submit`` to this cluster's head (the RayJob gets a cluster of its own).

Tokens, as the manifests give them: the Ray token as a file (``RAY_AUTH_TOKEN_PATH``, ray up's
file_mounts) to the head, worker, ingresses and job; as a value (``RAY_AUTH_TOKEN``, KubeRay's
Secret) to the ingress pod; the server's token as a file (``REWARD_SERVER_TOKEN_FILE``, ray
up's file_mounts and KubeRay's mounted Secret alike) to the ingresses and to the head, whose
job inherits it as the RayJob's pods do. HOME is an empty folder: no ``~/.ray/auth_token``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("trl", reason="the TRL engine needs the trl extra: pip install -e .[trl]")

from reward_server import domain as d
from reward_server.client import AsyncRewardClient, RewardCallError
from trainer.data.prepare import build_rows, sample_records, to_trl, write_parquet
from trainer.ray_head import NODE_PORT_FLAGS, free_ports, project_env, write_token

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
INSTALL_ROOT = "/home/ray/reward-server"
ITEM = d.ScoreItem("a", d.RubricScoreSpec("ctx", "It says w1 and w2.", ('It says "w1".',)))


# ---------------------------------------------------------------- the manifests' lines
def ray_up() -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load((DEPLOY / "ray_cluster.yaml").read_text())
    return raw


def line_calling(lines: list[str], sub: str) -> str:
    """The one manifest line that runs ``deploy/commands.sh <sub>``."""
    (line,) = [ln for ln in lines if re.search(rf"deploy/commands\.sh {sub}(\s|$)", ln)]
    return line


def runnable(line: str, *, append: str = "") -> str:
    """A manifest line as this machine runs it (the changes the module docstring lists)."""
    line = line.replace(INSTALL_ROOT, str(ROOT))
    line = re.sub(r"\s*--autoscaling-config=\S+", "", line)
    line = re.sub(r"\s*--object-manager-port=\d+", "", line)  # a free one is appended
    m = re.fullmatch(r"nohup (.*?)\s*>\s*\S+\s+2>&1\s*&", line.strip())
    line = m.group(1) if m else line.strip()
    return f"{line} {append}".strip()


def kuberay_ingress_command() -> list[str]:
    for doc in yaml.safe_load_all((DEPLOY / "kuberay" / "rayservice.yaml").read_text()):
        if doc["kind"] == "Deployment":
            (container,) = doc["spec"]["template"]["spec"]["containers"]
            return [c.replace(INSTALL_ROOT, str(ROOT)) for c in container["command"]]
    raise AssertionError("no ingress Deployment in rayservice.yaml")


def rayjob() -> dict[str, Any]:
    (job,) = yaml.safe_load_all((DEPLOY / "kuberay" / "rayjob.yaml").read_text())
    spec: dict[str, Any] = job["spec"]
    return spec


# ---------------------------------------------------------------- this machine's copies
def fake_configs(tmp: Path) -> tuple[Path, Path]:
    """(reward-server config, Serve config): the manifests' files with fake engines and this
    machine's paths."""
    cfg = yaml.safe_load((DEPLOY / "reward_server_config.yaml").read_text())
    for kind in ("judge", "nli"):
        cfg["engines"][kind] = {"kind": "fake", "batching": cfg["engines"][kind]["batching"]}
    config = tmp / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    serve_cfg = yaml.safe_load((DEPLOY / "serve_config.yaml").read_text())
    for app in serve_cfg["applications"]:
        app["args"]["config"] = str(config)
        kinds = [o.split("=")[0] for o in app["args"]["overrides"] if o.endswith(".kind") or ".kind=" in o]
        app["args"]["overrides"] = [f"{k}=fake" for k in kinds]
        for dep in app["deployments"]:
            dep["ray_actor_options"] = {"num_cpus": 0.25, "num_gpus": 0}
    serve = tmp / "serve_config.yaml"
    serve.write_text(yaml.safe_dump(serve_cfg, sort_keys=False))
    return config, serve


@dataclass
class Proc:
    name: str
    proc: subprocess.Popen[str]
    log: Path

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def start(name: str, argv: list[str], env: dict[str, str], logs: Path) -> Proc:
    log = logs / f"{name}.log"
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return Proc(name, proc, log)


def wait_for(p: Proc, pattern: str, timeout_s: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = re.search(pattern, p.log.read_text(errors="replace"), re.M)
        if m:
            return m
        if p.proc.poll() is not None:
            break
        time.sleep(0.5)
    raise AssertionError(f"{p.name}: no {pattern!r} (rc={p.proc.poll()}):\n{p.tail()}")


def node_pids(temp_dir: Path) -> list[int]:
    """Every process of the Ray node started with ``--temp-dir=temp_dir`` (cmdline names it)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if str(temp_dir) in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(entry.name))
    return out


def stop(p: Proc) -> None:
    if p.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.proc.pid, signal.SIGTERM)
        try:
            p.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.proc.pid, signal.SIGKILL)
            p.proc.wait(10)


def kill_node(temp_dir: Path) -> None:
    for pid in node_pids(temp_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(temp_dir, ignore_errors=True)


def node_flags(temp_dir: Path) -> str:
    ports = dict(zip(NODE_PORT_FLAGS, free_ports(len(NODE_PORT_FLAGS)), strict=True))
    return " ".join([f"--temp-dir={temp_dir}", "--node-ip-address=127.0.0.1",
                     *(f"{flag}={port}" for flag, port in ports.items())])


@dataclass
class Cluster:
    env: dict[str, str]  # what every process of the cluster gets (tokens, PATH, HOME)
    dashboard: str
    ingresses: list[tuple[str, int]]  # (gRPC target, HTTP port)
    server_token: str
    procs: list[Proc]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("cluster")
    logs = tmp / "logs"
    logs.mkdir()
    home = tmp / "home"
    home.mkdir()
    ray_token = write_token(tmp / "ray_auth_token")  # ray up: the file_mounts copy on each node
    server_token = secrets.token_hex(16)
    token_file = tmp / "reward-server-token"  # ray up: the file_mounts copy; KubeRay: the Secret
    token_file.write_text(server_token)
    token_file.chmod(0o600)
    config, serve_config = fake_configs(tmp)
    gcs, dash, client = free_ports(3)
    env = project_env({
        "HOME": str(home), "RAY_AUTH_TOKEN": None, "RAY_ADDRESS": None,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": None, "RAY_AUTH_TOKEN_PATH": str(ray_token),
        "REWARD_SERVER_TOKEN": None, "REWARD_SERVER_TOKEN_FILE": str(token_file),
        "REWARD_SERVER_CONFIG": str(config),
        "SERVE_CONFIG": str(serve_config), "RAY_PORT": str(gcs), "RAY_HEAD_IP": "127.0.0.1",
        "RAY_DASHBOARD_ADDRESS": f"http://127.0.0.1:{dash}", "REWARD_SERVER_HOST": "127.0.0.1",
        **{k: None for k in os.environ if k.startswith("REWARD_SERVER__")},
    })
    head_dir, worker_dir, pod_dir = (Path(f"/tmp/rc{n}_{os.getpid()}") for n in ("h", "w", "p"))
    procs: list[Proc] = []
    up = ray_up()
    try:
        # the head: ray up's head line (it starts the node and returns)
        head = start("head", ["bash", "-c", runnable(
            line_calling(up["head_start_ray_commands"], "head"),
            append=f"--num-cpus=0 --dashboard-host=127.0.0.1 --dashboard-port={dash} "
                   f"--ray-client-server-port={client} {node_flags(head_dir)}")], env, logs)
        assert head.proc.wait(180) == 0, head.tail()
        # a second node: ray up's worker line (RAY_HEAD_IP + RAY_PORT name the head)
        worker = start("worker", ["bash", "-c", runnable(
            line_calling(up["worker_start_ray_commands"], "worker"),
            append=f"--num-cpus=2 {node_flags(worker_dir)}")], env, logs)
        assert worker.proc.wait(180) == 0, worker.tail()
        # the engine applications: ray up's serve-deploy line (Serve's REST API on the head)
        deploy = start("serve-deploy", ["bash", "-c", runnable(
            line_calling(up["head_start_ray_commands"], "serve-deploy"))], env, logs)
        assert deploy.proc.wait(120) == 0, deploy.tail()
        # an ingress per node: ray up's (head, worker) and KubeRay's ingress pod (its own node)
        # port 0: each picks a free port and logs it (no race with the ports Ray's processes take)
        any_port = {"REWARD_SERVER_PORT": "0", "REWARD_SERVER__SERVER__HTTP__PORT": "0",
                    "REWARD_SERVER__SERVER__METRICS_PORT": "0", "RAY_ADDRESS": f"127.0.0.1:{gcs}"}
        ingress_env = [
            any_port,
            {**any_port, "REWARD_SERVER__SERVING__RAY__NODE_TEMP_DIR": str(worker_dir)},
            {**any_port, "REWARD_SERVER__SERVING__RAY__NODE_TEMP_DIR": str(pod_dir),
             "RAY_HEAD_ADDRESS": f"127.0.0.1:{gcs}",  # the manifest's reward-server-head-svc:6379
             # KubeRay: the token as a value from the Secret, not a file
             "RAY_AUTH_TOKEN": ray_token.read_text(), "RAY_AUTH_TOKEN_PATH": ""},
        ]
        pod_env = {k: v for k, v in {**env, **ingress_env[2]}.items() if v != ""}
        procs += [
            start("ingress-head", ["bash", "-c", runnable(
                line_calling(up["head_start_ray_commands"], "ingress"))],
                {**env, **ingress_env[0]}, logs),
            start("ingress-worker", ["bash", "-c", runnable(
                line_calling(up["worker_start_ray_commands"], "ingress"))],
                {**env, **ingress_env[1]}, logs),
            start("ingress-pod", [*kuberay_ingress_command(), *shlex.split(node_flags(pod_dir))],
                  pod_env, logs),
        ]
        ingresses = []
        for p in procs:
            grpc = wait_for(p, r"^listening on (\S+)$", 300).group(1)
            http = wait_for(p, r"HTTP/JSON door on http://127\.0\.0\.1:(\d+)", 10).group(1)
            ingresses.append((grpc, int(http)))
        yield Cluster(env, f"http://127.0.0.1:{dash}", ingresses, server_token, procs)
    finally:
        for p in procs:
            stop(p)
        for temp_dir in (pod_dir, worker_dir, head_dir):
            kill_node(temp_dir)


def test_ingress_per_node_answers_health_and_score_with_both_tokens(cluster: Cluster) -> None:
    targets = [t for t, _ in cluster.ingresses]
    assert len(set(targets)) == 3
    for p in cluster.procs:  # progress while the applications came up, then attached
        text = p.log.read_text(errors="replace")
        assert "attaching to Serve applications reward-judge, reward-nli" in text, p.tail()
        assert re.search(r"Serve application reward-judge \(model fake-judge\) is RUNNING", text)
    for target in targets:
        health = subprocess.run([sys.executable, "-m", "reward_server", "health", "--target", target],
                                env=cluster.env, capture_output=True, text=True, timeout=60)
        assert health.stdout.strip() == "SERVING", health.stdout + health.stderr

    async def score(target: str, token: str | None) -> list[d.ItemResult]:
        async with AsyncRewardClient(target, token=token, timeout_s=30) as c:
            return list(await c.score([ITEM]))

    for target in targets:
        (result,) = asyncio.run(score(target, cluster.server_token))
        assert result.item_id == "a" and result.status == d.ItemStatus.OK and result.reward is not None
    with pytest.raises(RewardCallError) as refused:
        asyncio.run(score(targets[0], None))
    assert refused.value.code.name == "UNAUTHENTICATED"
    # the HTTP door, same token
    _, http_port = cluster.ingresses[1]
    body = json.dumps({"items": [{"id": "h", "rubric_score": {"context": "ctx", "text": "w1",
                                                              "rules": ['It says "w1".']}}]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{http_port}/v1/score", data=body, method="POST",
                                 headers={"Authorization": f"Bearer {cluster.server_token}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        answer = json.loads(r.read())
    assert answer["results"][0]["id"] == "h" and answer["results"][0]["status"] == "ITEM_STATUS_OK", answer
    time.sleep(3)  # a few of the health watcher's rounds (server.health_poll_s = 1 s)
    for p in cluster.procs:  # health never flapped (Serve's status calls raced across threads)
        text = p.log.read_text(errors="replace")
        assert "NOT_SERVING" not in text and "pickle by value" not in text, p.tail()


def test_the_rayjob_entrypoint_trains_one_trl_step_against_the_ingresses(
        cluster: Cluster, smollm2_path: str, tmp_path: Path) -> None:
    spec = rayjob()
    argv = shlex.split(spec["entrypoint"])
    flags = {a: argv[i + 1] for i, a in enumerate(argv) if a.startswith("--") and i + 1 < len(argv)}
    assert flags["--engine"] == "verl" and flags["--reward-server"].startswith("dns:///")
    targets = ",".join(t for t, _ in cluster.ingresses)
    swap = {"--engine": "trl", "--reward-server": targets, "--output-dir": str(tmp_path / "runs")}
    entry: list[str] = []
    it = iter(argv)
    for a in it:
        if a in swap:
            entry += [a, swap[a]]
            next(it)
        elif "=" in a and not a.startswith("--"):
            continue  # verl's Hydra overrides: verl only
        else:
            entry.append(a)
    records = sample_records(history_limit=1)[:1]
    write_parquet(to_trl(build_rows(records, "personalized_generator", history_limit=1)),
                  tmp_path / "data" / "trl_train.parquet")
    entry += ["--data", str(tmp_path / "data"), "--model", smollm2_path, "--max-steps", "1",
              "--prompts-per-step", "1", "--num-generations", "2", "--max-completion-length", "8"]
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    runtime_env["working_dir"] = str(ROOT)
    # a worktree's .venv may be a symlink, which .gitignore's `.venv/` does not match
    runtime_env["excludes"] = [".venv", ".venv-vllm"]
    runtime_env["env_vars"]["REWARD_SERVER_ADDRESS"] = targets
    cmd = ["ray", "job", "submit", "--address", cluster.dashboard,
           "--runtime-env-json", json.dumps(runtime_env), "--", *entry]
    job = subprocess.run(cmd, cwd=ROOT, env=cluster.env, capture_output=True, text=True, timeout=600)
    out = job.stdout + job.stderr
    assert job.returncode == 0, out[-6000:]
    run_name = flags["--run-name"]
    assert re.search(r"step 1/1  reward \d", out), out[-3000:]
    run_log = tmp_path / "runs" / run_name / "run_log.jsonl"
    assert '"reward"' in run_log.read_text()
    assert cluster.server_token not in out
    listing = subprocess.run(["ray", "job", "list", "--address", cluster.dashboard], cwd=ROOT,
                             env=cluster.env, capture_output=True, text=True, timeout=120)
    assert listing.returncode == 0 and "trainer/run.py" in listing.stdout, listing.stderr[-2000:]
    assert cluster.server_token not in listing.stdout + listing.stderr


def test_a_worker_whose_token_the_head_refuses_stops_in_seconds_with_one_line(
        cluster: Cluster, tmp_path: Path) -> None:
    wrong = write_token(tmp_path / "wrong")
    line = runnable(line_calling(ray_up()["worker_start_ray_commands"], "worker"),
                    append=f"--num-cpus=1 {node_flags(tmp_path / 'node')}")
    start = time.monotonic()
    proc = subprocess.run(["bash", "-c", line], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**cluster.env, "RAY_AUTH_TOKEN_PATH": str(wrong)})
    took = time.monotonic() - start
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = (proc.stdout + proc.stderr).strip().splitlines()
    # the one line, besides what the manifest line's own `ulimit -n` may say on this machine
    (error,) = [ln for ln in out if "ulimit" not in ln]
    assert len(out) <= 2, out
    assert error.startswith("error: deploy/commands.sh worker: the head at 127.0.0.1:") and \
        "refused this node's Ray token (InvalidAuthToken)" in error and "RAY_AUTH_TOKEN" in error
    assert took < 30, took  # a bound, not a benchmark: ray start retried for 22.7 s (63 lines)
