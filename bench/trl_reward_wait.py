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
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.learning import prepare_sample, start_server  # noqa: E402

PY = sys.executable


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
    data = out / "data"
    prepare_sample(data, history_limit=2)
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
