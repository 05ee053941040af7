"""Benchmark: the share of TRL step time spent waiting for rewards, with and without the reward
prefetch of ``trainer.trl_runner`` (the Score call started right after generation, overlapping
TRL's reference-model forward), on `make demo`'s TRL path.

    flock /tmp/cpu-heavy.lock .venv/bin/python bench/trl_reward_wait.py [--steps 4] [--rounds 2]

One reward server (deploy/cpu_local.yaml's engines: SmolLM2-135M judge, judge-as-NLI, but
hosted in-process instead of on Ray, to keep the run short), the demo's data (shipped sample,
personalized-generator task, rubric_score reward) and the demo's TRL arguments (1 prompt x 4
generations, 48 new tokens, temperature 1.0, lr 5e-5, SmolLM2 policy on CPU). ``--rounds``
rounds, each one run with the prefetch off, then one with it on (interleaved, so a busy machine
slows both alike), ``--steps`` steps each. Prints per run: step seconds, ``reward/wait_s`` (the
trainer's wait) and ``reward/score_s`` (the whole Score call, logged with the prefetch), the
reward-wait share of step time, and the totals' ratio. The rewards of the two runs differ only
through sampling (same seed: same first batch).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PY = sys.executable


def start_server(log: Path) -> tuple[subprocess.Popen[str], str]:
    cmd = [PY, "-m", "reward_server", "serve", "--host", "127.0.0.1", "--port", "0",
           "--set", "engines.judge={kind: transformers, model: smollm2-local, num_threads: 1, "
           "forward_batch_size: 16, batching: {max_items: 256, wait_ms: 2}}",
           "--set", "engines.nli={kind: judge}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise SystemExit(f"reward server exited with {proc.returncode}; see {log}")
        m = re.search(r"listening on ([\d.]+):(\d+)", line)
        if m:
            return proc, f"{m.group(1)}:{m.group(2)}"
    proc.kill()
    raise SystemExit(f"reward server did not start; see {log}")


def rows(log: Path) -> list[dict[str, float]]:
    out = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    return [r for r in out if "reward" in r]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="run folder (default: a temp folder)")
    args = ap.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="trl-reward-wait-"))
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([PY, "-m", "reward_server", "models", "prepare-smollm2"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    data = out / "data"
    subprocess.run([PY, "-m", "trainer.data.prepare", "--sample", "--task", "personalized_generator",
                    "--reward-kind", "rubric_score", "--history-limit", "2", "--out", str(data)],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    server, target = start_server(out / "server.log")
    totals: dict[bool, list[float]] = {False: [0.0, 0.0, 0.0], True: [0.0, 0.0, 0.0]}
    print("| round | prefetch | steps | step s | reward wait s | Score call s | wait share |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    try:
        for rnd in range(args.rounds):
            for prefetch in (False, True):
                name = f"r{rnd}-{'prefetch' if prefetch else 'serial'}"
                cmd = [PY, "trainer/run.py", "--engine", "trl", "--data", str(data), "--reward-server", target,
                       "--output-dir", str(out), "--run-name", name, "--max-steps", str(args.steps),
                       "--prompts-per-step", "1", "--num-generations", "4", "--max-completion-length", "48",
                       "--learning-rate", "5e-5", "--temperature", "1.0", "--device", "cpu"]
                if not prefetch:
                    cmd.append("--no-reward-prefetch")
                with (out / f"{name}.log").open("w") as log:
                    subprocess.run(cmd, cwd=ROOT, check=True, stdout=log, stderr=subprocess.STDOUT)
                rs = rows(out / name / "run_log.jsonl")
                step_s = sum(r.get("step_time", 0.0) for r in rs)
                wait_s = sum(r.get("reward/wait_s", 0.0) for r in rs)
                score_s = sum(r.get("reward/score_s", r.get("reward/wait_s", 0.0)) for r in rs)
                for i, v in enumerate((step_s, wait_s, score_s)):
                    totals[prefetch][i] += v
                print(f"| {rnd} | {'on' if prefetch else 'off'} | {len(rs)} | {step_s:.1f} | {wait_s:.2f} | "
                      f"{score_s:.2f} | {100 * wait_s / step_s:.1f}% |", flush=True)
    finally:
        server.terminate()
        server.wait(60)
    (s0, w0, c0), (s1, w1, c1) = totals[False], totals[True]
    print(f"\nreward-wait share of step time: off {100 * w0 / s0:.1f}%, on {100 * w1 / s1:.1f}%")
    print(f"reward wait on / off = {w1 / w0:.2f}x; Score call on / off = {c1 / c0:.2f}x; "
          f"step time on / off = {s1 / s0:.2f}x")
    print(f"runs and logs: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
