"""Benchmark: where a TRL GRPO step's time goes on CPU, and what running each group's prompt once
in the log-prob forwards (``trainer.trl_shared_prompt``, the default) saves against TRL's own
path (``--no-shared-prompt``), at `make demo`'s shape.

    flock /tmp/cpu-heavy.lock .venv/bin/python bench/trl_step_time.py [--steps 4] [--rounds 3]

`make demo`'s data and TRL arguments (shipped sample, personalized-generator task, rubric_score
reward; 1 prompt x 4 completions x 48 new tokens, temperature 1.0, lr 5e-5, SmolLM2-135M policy
on CPU) against one reward server (the SmolLM2 judge in-process, as bench/trl_reward_wait.py).
``--rounds`` rounds, each one run on TRL's path then one on the shared-prompt path
(interleaved, so a busy machine slows both alike), ``--steps`` steps each, same seed (same
completions: the log-probs agree to float rounding). The first step of a run (warm-up) is left
out. Prints each run's median step and the median of every section (``time/*`` in the run log,
trainer/trl_profile.py), then per section the two paths' medians and the ratio shared / TRL
(median and range over the rounds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.learning import prepare_sample, start_server  # noqa: E402
from trainer.trl_profile import SECTIONS  # noqa: E402

PY = sys.executable
PATHS = {"trl": ["--no-shared-prompt"], "shared": []}


def sections(run_dir: Path) -> dict[str, float]:
    """Median seconds per section over the run's steps, its first step left out."""
    rows = [json.loads(x) for x in (run_dir / "run_log.jsonl").read_text().splitlines() if x.strip()]
    rows = [r for r in rows if "time/step" in r][1:]
    if not rows:
        raise SystemExit(f"{run_dir}: no timed steps past the first; give --steps 2 or more")
    return {s: statistics.median(float(r.get(f"time/{s}", 0.0)) for r in rows) for s in (*SECTIONS, "step")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reward-server", help="HOST:PORT of a running server (default: start one here)")
    ap.add_argument("--out", type=Path, default=None, help="run folder (default: a temp folder)")
    args = ap.parse_args(argv)
    out = (args.out or Path(tempfile.mkdtemp(prefix="trl-step-time-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = out / "data"
    prepare_sample(data, history_limit=2)
    server, target = (None, args.reward_server) if args.reward_server else start_server(out / "server.log")
    runs: dict[str, list[dict[str, float]]] = {p: [] for p in PATHS}
    head = " | ".join(SECTIONS)
    print(f"| round | path | step s | {head} |\n|---:|---|---:|{'---:|' * len(SECTIONS)}", flush=True)
    try:
        for rnd in range(args.rounds):
            for path, flags in PATHS.items():
                name = f"r{rnd}-{path}"
                cmd = [PY, "trainer/run.py", "--engine", "trl", "--data", str(data), "--reward-server", target,
                       "--output-dir", str(out), "--run-name", name, "--max-steps", str(args.steps),
                       "--prompts-per-step", "1", "--num-generations", "4", "--max-completion-length", "48",
                       "--learning-rate", "5e-5", "--temperature", "1.0", "--device", "cpu", *flags]
                with (out / f"{name}.log").open("w") as log:
                    subprocess.run(cmd, cwd=ROOT, check=True, stdout=log, stderr=subprocess.STDOUT)
                med = sections(out / name)
                runs[path].append(med)
                cells = " | ".join(f"{med[s]:.2f}" for s in SECTIONS)
                print(f"| {rnd} | {path} | {med['step']:.1f} | {cells} |", flush=True)
    finally:
        if server is not None:
            server.terminate()
            server.wait(60)
    print("\n| section | TRL's path s | shared prompt s | shared / TRL (median, range over rounds) |")
    print("|---|---:|---:|---|")
    for s in ("step", *SECTIONS):
        base = [r[s] for r in runs["trl"]]
        new = [r[s] for r in runs["shared"]]
        ratios = [n / b for n, b in zip(new, base, strict=True) if b > 0.005]
        ratio = (f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else "-")
        print(f"| {s} | {statistics.median(base):.2f} | {statistics.median(new):.2f} | {ratio} |")
    print(f"\nruns and logs: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
