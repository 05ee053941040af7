"""Does a policy trained through ``trainer/run.py`` against the reward server get better?

    flock /tmp/cpu-heavy.lock .venv/bin/python bench/learning.py [--steps 20] [--out runs/learning]

SmolLM2-135M-Instruct, TRL engine on CPU, trained through ``trainer/run.py`` against a real
reward server (the SmolLM2 transformers judge, in-process, started here unless
``--reward-server`` names one) on the shipped sample's personalized-generator task (``make
demo``'s data, ``--history-limit`` past texts a prompt; every user's rubric replaced by the one
``--rule``, reward = its p_yes), and evaluated on the HELD-OUT users (``trl_val.parquet``: one
user per source, never trained on) before training, every ``--eval-every`` steps (default: only
before and after) and after: ``--eval-generations`` completions per prompt, sampled as in
training, scored by the same server. Three arms, run one after the other, same seed:

* ``trained``:  the rewards as the server gives them;
* ``shuffled``: each step's rewards permuted across its completions (``--reward-transform
  shuffle``): the same values, no longer tied to the texts, so it must NOT learn;
* ``negated``:  the rewards' sign flipped (``--reward-transform negate``): it must get WORSE.

The learning rate (default 2e-5, ramped up over the first half of the steps, then down) is set
so that a run's drift from training noise alone stays below the evaluation's sampling error:
the shuffled arm's criterion compares one run against that error, and at 7e-5 the shuffled arm
moved up to 5 SE either way depending on the seed (docs/training.md "Does it learn?").

Held-out reward: the mean over prompts of each prompt's mean, with its standard error over the
sampling (prompts held fixed; ``trainer.heldout``); a change is judged against the standard
error of the difference, ``sqrt(se_before^2 + se_after^2)``. Done when the trained arm gains
>= 3 of those, the shuffled arm moves < 2, and the negated arm ends below where it started.

What it measures: that the training path turns the server's rewards into a policy that earns
more of them on users it never saw (sign, row/reward alignment, advantages, the update), and
the controls say the gain comes from the rewards' link to the texts. What it does NOT measure:
quality. SmolLM2-135M is a plumbing judge; its p_yes hardly reads the rule (see
docs/training.md "Does it learn?"), so the policy learns what SmolLM2 likes to say yes to.

Prints a table (arm, held-out before/after with standard errors, change in standard errors,
verdict), each arm's per-step time breakdown, and writes ``learning.json`` and ``learning.png``
(train reward per step and held-out reward per evaluation, all arms) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainer.heldout import HeldOut, summarize  # noqa: E402
from trainer.trl_profile import SECTIONS  # noqa: E402

PY = sys.executable
ARMS = {"trained": "none", "shuffled": "shuffle", "negated": "negate"}
# SmolLM2's p_yes follows text length in this rule's direction (shortened texts: +0.03, 28 of 40)
RULE = "The text is short: at most ten words."
JUDGE = ("engines.judge={kind: transformers, model: smollm2-local, num_threads: 1, forward_batch_size: 16, "
         "batching: {max_items: 256, wait_ms: 2}}")


def prepare_sample(data: Path, *, history_limit: int, extra: Sequence[str] = ()) -> None:
    """The local SmolLM2 (converted once) and the shipped sample's personalized-generator data
    with rubric_score rewards in ``data`` (``extra``: more ``trainer.data.prepare`` arguments)."""
    subprocess.run([PY, "-m", "reward_server", "models", "prepare-smollm2"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run([PY, "-m", "trainer.data.prepare", "--sample", "--task", "personalized_generator",
                    "--reward-kind", "rubric_score", "--history-limit", str(history_limit), *extra,
                    "--out", str(data)], cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def start_server(log: Path) -> tuple[subprocess.Popen[str], str]:
    """``reward-server serve`` with the SmolLM2 transformers judge, in-process, on a free port."""
    cmd = [PY, "-m", "reward_server", "serve", "--host", "127.0.0.1", "--port", "0",
           "--set", JUDGE, "--set", "engines.nli={kind: judge}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise SystemExit(f"reward server exited with {proc.returncode}; see {log}")
        m = re.search(r"listening on ([\d.]+):(\d+)", line)
        if m:
            return proc, f"{m.group(1)}:{m.group(2)}"
    proc.kill()
    raise SystemExit(f"reward server did not start within 600 s; see {log}")


def train_arm(args: argparse.Namespace, *, arm: str, data: Path, target: str, out: Path,
              eval_on_start: bool) -> Path:
    """One arm through ``trainer/run.py``; its run folder."""
    cmd = [PY, "trainer/run.py", "--engine", "trl", "--data", str(data), "--reward-server", target,
           "--output-dir", str(out), "--run-name", arm, "--device", "cpu", "--seed", str(args.seed),
           "--max-steps", str(args.steps), "--prompts-per-step", str(args.prompts_per_step),
           "--num-generations", str(args.num_generations),
           "--max-completion-length", str(args.max_completion_length),
           "--learning-rate", str(args.learning_rate), "--warmup-steps", str(args.warmup_steps),
           "--temperature", str(args.temperature),
           "--top-k", str(args.top_k), "--eval-steps", str(args.eval_every or args.steps),
           "--eval-generations", str(args.eval_generations), "--reward-transform", ARMS[arm], "--profile"]
    if not eval_on_start:
        cmd.append("--no-eval-on-start")
    run_dir = out / arm
    if run_dir.exists():
        raise SystemExit(f"{run_dir} exists; give a fresh --out")
    start = time.monotonic()
    with (out / f"{arm}.log").open("w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            if "trainer.progress" in line or re.match(r"step \d+/", line):
                print(f"  [{arm}] {line.split(': ', 1)[-1].rstrip()}", flush=True)
        if proc.wait() != 0:
            raise SystemExit(f"arm {arm} failed (exit {proc.returncode}); see {out / f'{arm}.log'}")
    print(f"  [{arm}] done in {(time.monotonic() - start) / 60:.1f} min", flush=True)
    return run_dir


def log_rows(run_dir: Path) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in (run_dir / "run_log.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in rows if "reward" in r and "step" in r]


def train_reward(row: dict[str, Any]) -> float:
    """The step's mean reward as the server gave it (before a control arm's transform)."""
    return float(row.get("reward_raw", row["reward"]))


def verdict(arm: str, before: HeldOut, after: HeldOut) -> tuple[float, bool, str]:
    se = math.sqrt(before.se ** 2 + after.se ** 2)
    z = (after.mean - before.mean) / se
    if arm == "trained":
        return z, z >= 3, "after - before >= 3 SE"
    if arm == "shuffled":
        return z, abs(z) < 2, "|after - before| < 2 SE"
    return z, after.mean < before.mean, "after < before"


def time_breakdown(rows: list[dict[str, Any]]) -> str:
    """Median seconds per section over the arm's steps (the first step aside when there are more)."""
    import statistics

    body = rows[1:] if len(rows) > 1 else rows
    med = {s: statistics.median(float(r.get(f"time/{s}", 0.0)) for r in body) for s in (*SECTIONS, "step")}
    wall = med["step"] or 1.0
    parts = ", ".join(f"{s} {med[s]:.1f} ({100 * med[s] / wall:.0f}%)" for s in SECTIONS if med[s] >= 0.01 * wall)
    return f"median step {med['step']:.1f} s: {parts}"


def plot(results: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"trained": "tab:blue", "shuffled": "tab:gray", "negated": "tab:red"}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for arm, res in results["arms"].items():
        steps = [r["step"] for r in res["train"]]
        values = [r["reward"] for r in res["train"]]
        ax1.plot(steps, values, color=colors[arm], alpha=0.35, lw=1)
        k = 5
        smooth = [sum(values[max(0, i - k + 1):i + 1]) / len(values[max(0, i - k + 1):i + 1])
                  for i in range(len(values))]
        ax1.plot(steps, smooth, color=colors[arm], lw=2, label=f"{arm} (5-step mean)")
        held = res["heldout"]
        ax2.errorbar([h["step"] for h in held], [h["mean"] for h in held], yerr=[h["se"] for h in held],
                     color=colors[arm], marker="o", capsize=3, label=arm)
    ax1.set(title="train reward (server's, before the arm's transform)", xlabel="step", ylabel="reward")
    ax2.set(title=f"held-out reward ({results['heldout_prompts']} prompts x {results['eval_generations']}, "
                  "± 1 SE)", xlabel="step", ylabel="reward")
    for ax in (ax1, ax2):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"SmolLM2-135M GRPO (TRL, CPU) vs the SmolLM2 judge: {results['steps']} steps, "
                 f"lr {results['learning_rate']:g} (ramp {results['warmup_steps']} steps)", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / f"learning-{time.strftime('%Y%m%d-%H%M%S')}")
    ap.add_argument("--reward-server", help="HOST:PORT of a running server (default: start one here)")
    ap.add_argument("--arms", default=",".join(ARMS), help="comma list of %(default)s")
    ap.add_argument("--rule", default=RULE, help="every user's one rubric rule (default %(default)r)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--eval-every", type=int, default=0,
                    help="held-out evaluation every N steps (default 0: before the first step and after the last)")
    ap.add_argument("--eval-generations", type=int, default=32, help="completions per held-out prompt")
    # one prompt of 8: its tokens are computed once in generation and the log-prob forwards (the shared-prompt
    # path), and a group of 8 ranks its completions better than two of 4 at the same cost
    ap.add_argument("--prompts-per-step", type=int, default=1)
    ap.add_argument("--num-generations", type=int, default=8)
    # the prompt's tokens dominate a CPU step: one example of the user's past reviews, not two
    ap.add_argument("--history-limit", type=int, default=1, help="past texts per prompt (default %(default)s)")
    ap.add_argument("--max-completion-length", type=int, default=48)
    # at 7e-5 with the ramp the trained arm gained +0.069 and the shuffled arm drifted -0.013 / +0.023
    # (seeds 0 / 1) against a sampling SE of about 0.0045: the rate sets both, the criteria are in SE
    ap.add_argument("--learning-rate", type=float, default=2e-5)
    # the rate ramps up over the first half, then decays (trainer/run.py --warmup-steps): from the
    # first step, Adam's sign-like early updates threw the policy around (per-token KL 0.06-0.15
    # after one step, every arm's texts at the length cap by step 3-4) and the shuffled arm moved
    # -12.4 / +4.1 SE (seeds 0 / 1, 7e-5); the ramp keeps the same area under the rate
    ap.add_argument("--warmup-steps", type=int, default=None,
                    help="learning-rate ramp, trainer/run.py --warmup-steps (default: half of --steps)")
    # the verl presets' sampling (paper_grpo.yaml: temperature 0.6, top_p 0.95, top_k 20)
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.warmup_steps is None:
        args.warmup_steps = args.steps // 2
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise SystemExit(f"--arms: unknown {unknown}; choose among {list(ARMS)}")
    out = args.out.expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    data = out / "data"
    rules = out / "rules.jsonl"
    users = [json.loads(x)["user_id"] for x in (ROOT / "trainer/data/sample/rules.jsonl").read_text().splitlines()
             if x.strip()]
    rules.write_text("".join(json.dumps({"user_id": u, "rules": [args.rule]}) + "\n" for u in users))
    prepare_sample(data, history_limit=args.history_limit, extra=("--rules", str(rules)))
    server, target = (None, args.reward_server) if args.reward_server else start_server(out / "server.log")
    print(f"reward server {target}; runs in {out}", flush=True)
    results: dict[str, Any] = {"steps": args.steps, "learning_rate": args.learning_rate,
                               "warmup_steps": args.warmup_steps,
                               "eval_generations": args.eval_generations, "arms": {},
                               "command": " ".join([Path(PY).name, "bench/learning.py", *(argv or sys.argv[1:])])}
    before: dict[int, HeldOut] = {}
    try:
        for arm in arms:
            print(f"\n== arm {arm} (--reward-transform {ARMS[arm]})", flush=True)
            arm_start = time.monotonic()
            # the initial policy is evaluated once, in the first arm: the others start from the
            # same weights with the same seed, so theirs would be the same completions and rewards
            run_dir = train_arm(args, arm=arm, data=data, target=target, out=out, eval_on_start=not before)
            rows = log_rows(run_dir)
            held = {**before, **summarize(run_dir / "heldout")}
            before = before or {0: held[0]}
            results["arms"][arm] = {
                "minutes": (time.monotonic() - arm_start) / 60,
                "train": [{"step": int(r["step"]), "reward": train_reward(r),
                           **{k: float(v) for k, v in r.items() if k.startswith("time/")}} for r in rows],
                "heldout": [{"step": s, "mean": h.mean, "se": h.se, "prompts": h.prompts, "samples": h.samples}
                            for s, h in held.items()],
                "time_breakdown": time_breakdown(rows),
            }
            results["heldout_prompts"] = next(iter(held.values())).prompts
    finally:
        if server is not None:
            server.terminate()
            server.wait(60)
    results["minutes"] = (time.monotonic() - t0) / 60

    print("\n| arm | held-out before | held-out after | change | change / SE | criterion | met |")
    print("|---|---:|---:|---:|---:|---|---|")
    ok = True
    for arm, res in results["arms"].items():
        first, last = (HeldOut(mean=h["mean"], se=h["se"], prompts=h["prompts"], samples=h["samples"])
                       for h in (res["heldout"][0], res["heldout"][-1]))
        z, met, rule = verdict(arm, first, last)
        res.update(z=z, met=met)
        ok &= met
        print(f"| {arm} | {first.mean:.4f} ± {first.se:.4f} | {last.mean:.4f} ± {last.se:.4f} | "
              f"{last.mean - first.mean:+.4f} | {z:+.1f} | {rule} | {'yes' if met else 'NO'} |")
    print()
    for arm, res in results["arms"].items():
        print(f"{arm}: {res['time_breakdown']}; arm {res['minutes']:.1f} min")
    print(f"all arms: {results['minutes']:.1f} min (server start and data included)")
    (out / "learning.json").write_text(json.dumps(results, indent=1))
    plot(results, out / "learning.png")
    print(f"results: {out / 'learning.json'}\nplot:    {out / 'learning.png'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
