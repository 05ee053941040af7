"""NLI throughput: our engine against sentence-transformers CrossEncoder, same model, same process.

    python bench/nli_throughput.py                       # CPU, 2,000 pairs, random deberta-v3-small shape
    python bench/nli_throughput.py --pairs 300 --quantize int8
    python bench/nli_throughput.py --device cuda --model-shape deberta-v3-large --random-weights

Runs (a) CrossEncoder.predict one pair at a time (how NLICV's released code scores), (b)
CrossEncoder.predict with batch_size 32, (c) our TransformersNLI (length-sorted buckets under a
padded-token budget) and, with --quantize int8, (d) the same with int8 dynamic quantization;
prints pairs/s, the ratio to (a) and (b), and the largest |P(entailment) difference| from (a).
Pairs are synthetic word sequences with premise lengths spread over 10-400 tokens. The default
model is a random-weight model of the cross-encoder/nli-deberta-v3-small shape built on the fly
with the MiniLM tokenizer (reward_server.backends.tiny_models); throughput does not depend on the
weight values. On CUDA it also reports pairs/s at 128/256/512 tokens per pair and the share of
the bf16 peak (--peak-tflops, H200 ~790 dense), FLOPs estimated as 2 x encoder params x tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from reward_server.backends.base import NLIPair
from reward_server.backends.settings import TransformersNLISettings
from reward_server.backends.tiny_models import build_tiny_nli_model
from reward_server.backends.transformers_nli import TransformersNLI


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", help="HF id or local folder (default: random weights, see --model-shape)")
    ap.add_argument(
        "--model-shape", default="deberta-v3-small", choices=["tiny", "deberta-v3-small", "deberta-v3-large"]
    )
    ap.add_argument(
        "--random-weights",
        action="store_true",
        help="build a random-weight model of --model-shape (the default without --model)",
    )
    ap.add_argument("--pairs", type=int, default=2000)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--quantize", choices=["none", "int8"], default="none")
    ap.add_argument(
        "--token-budgets", default="", help="comma list: also time our engine at these padded-token budgets"
    )
    ap.add_argument("--token-budget", type=int, default=None, help="our engine's budget (default: engine's)")
    ap.add_argument("--skip-single", action="store_true", help="skip (a); ratios then use (b)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (see main)")
    ap.add_argument("--peak-tflops", type=float, default=790.0)
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)  # fmt: skip


def make_pairs(tokenizer: Any, n: int, seed: int) -> list[NLIPair]:
    rng = random.Random(seed)
    words = [w for w in tokenizer.get_vocab() if w.isalpha() and w.isascii() and len(w) > 2]
    words.sort()
    pairs = []
    for _ in range(n):
        plen = rng.randint(10, 400)
        premise = " ".join(rng.choice(words) for _ in range(plen)) + "."
        hyp = " ".join(rng.choice(words) for _ in range(rng.randint(5, 15))) + "."
        pairs.append(NLIPair(premise, hyp))
    return pairs


def fixed_length_pairs(tokenizer: Any, n: int, total: int, seed: int) -> list[NLIPair]:
    rng = random.Random(seed)
    words = sorted(w for w in tokenizer.get_vocab() if w.isalpha() and w.isascii() and len(w) > 2)
    out = []
    for _ in range(n):
        hyp = " ".join(rng.choice(words) for _ in range(10))
        premise = " ".join(rng.choice(words) for _ in range(total - 10 - 3))
        out.append(NLIPair(premise, hyp))
    return out


def softmax_col(logits: np.ndarray, col: int) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(axis=1, keepdims=True))[:, col]


def timed(fn: Any) -> tuple[Any, float]:
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def sync_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    import torch
    from sentence_transformers import CrossEncoder
    from transformers import AutoTokenizer

    torch.manual_seed(args.seed)
    tmp = tempfile.TemporaryDirectory(prefix="nli-bench-")
    model = args.model
    if model is None or args.random_weights:
        model = str(build_tiny_nli_model(Path(tmp.name) / "model", shape=args.model_shape))
        print(f"model: random-weight {args.model_shape} shape (MiniLM tokenizer) at {model}")
    else:
        print(f"model: {model}")
    print(f"device: {args.device}, torch threads: {torch.get_num_threads()}, pairs: {args.pairs}")
    tok = AutoTokenizer.from_pretrained(model)
    pairs = make_pairs(tok, args.pairs, args.seed)

    def engine(quantize: bool, budget: int | None) -> TransformersNLI:
        s = TransformersNLISettings(model=model, device=args.device,
                               token_budget=budget, quantize_int8=quantize)  # fmt: skip
        return TransformersNLI.from_settings(s)

    ours = engine(False, args.token_budget)
    ent = ours._ent
    ce_kwargs: dict[str, Any] = {}
    if args.device.startswith("cuda"):
        ce_kwargs["model_kwargs"] = {"dtype": torch.bfloat16}
    ce = CrossEncoder(model, device=args.device, max_length=ours.max_length, **ce_kwargs)

    # Every method is a callable over a chunk of pairs returning P(entailment). The pairs are cut
    # into --rounds chunks and the methods take turns on each chunk, so that load changes on a
    # shared machine hit every method alike; each method's time is summed over the rounds.
    def ce_single(chunk: list[NLIPair]) -> list[float]:
        out = [ce.predict([(p.premise, p.hypothesis)], batch_size=1, show_progress_bar=False)[0]
               for p in chunk]  # fmt: skip
        return list(softmax_col(np.asarray(out, dtype=np.float64), ent))

    def ce_batch(chunk: list[NLIPair]) -> list[float]:
        out = ce.predict([(p.premise, p.hypothesis) for p in chunk], batch_size=32,
                         show_progress_bar=False)  # fmt: skip
        return list(softmax_col(np.asarray(out, dtype=np.float64), ent))

    def ours_fn(eng: TransformersNLI) -> Any:
        def run(chunk: list[NLIPair]) -> list[float]:
            res = asyncio.run(eng.entailment(chunk))
            sync_cuda()
            return [s.entailment for s in res]

        return run

    methods: list[tuple[str, Any]] = []
    if not args.skip_single:
        methods.append(("(a) CrossEncoder one pair at a time", ce_single))
    methods.append(("(b) CrossEncoder batch_size=32", ce_batch))
    methods.append((f"(c) ours, token budget {ours.token_budget}", ours_fn(ours)))
    for b in [int(x) for x in args.token_budgets.split(",") if x.strip()]:
        methods.append((f"(c) ours, token budget {b}", ours_fn(engine(False, b))))
    if args.quantize == "int8":
        q = engine(True, args.token_budget)
        methods.append((f"(d) ours + int8 dynamic quant, budget {q.token_budget}", ours_fn(q)))
    for _, fn in methods:  # warm-up
        fn(pairs[:4])
    times = [0.0] * len(methods)
    probs: list[list[float]] = [[] for _ in methods]
    size = -(-len(pairs) // max(1, args.rounds))
    for r, lo in enumerate(range(0, len(pairs), size)):
        chunk = pairs[lo : lo + size]
        for k, (_, fn) in enumerate(methods):
            t = time.perf_counter()
            probs[k] += fn(chunk)
            times[k] += time.perf_counter() - t
        print(f"  round {r + 1}: " + ", ".join(f"{len(probs[k]) / times[k]:.2f}"
              for k in range(len(methods))) + " pairs/s so far", file=sys.stderr, flush=True)  # fmt: skip
    rows = [(label, len(pairs) / times[k], np.array(probs[k])) for k, (label, _) in enumerate(methods)]
    _, ref_rate, ref_probs = rows[0]
    base_b = rows[1][1] if not args.skip_single else rows[0][1]
    print(f"\n{'run':52s} {'pairs/s':>9s} {'x(a)':>7s} {'x(b)':>7s} {'max|dp| vs (a)':>15s}")
    for label, rate, probs in rows:
        n = min(len(probs), len(ref_probs))
        diff = float(np.max(np.abs(probs[:n] - ref_probs[:n]))) if n else float("nan")
        print(f"{label:52s} {rate:9.2f} {rate / ref_rate:7.2f} {rate / base_b:7.2f} {diff:15.5f}")
    if args.device.startswith("cuda"):
        gpu_fixed_lengths(ours, tok, args)
    tmp.cleanup()
    return 0


def fixed_length_rates(
    eng: TransformersNLI, tok: Any, *, lengths: Sequence[int] = (128, 256, 512), pairs_at: Any = None,
    peak_tflops: float = 790.0, seed: int = 0,
) -> list[dict[str, float]]:
    """Pairs/s of ``eng`` on pairs of exactly ``lengths`` tokens each, with the TFLOP/s that
    implies (2 x encoder params x tokens, attention left out) and its share of ``peak_tflops``.
    ``pairs_at(total)``: how many pairs to time at each length (default ~2M tokens' worth)."""
    model = eng._model
    params = sum(p.numel() for n, p in model.named_parameters() if "embeddings" not in n)
    rows = []
    for total in lengths:
        n = pairs_at(total) if pairs_at else max(256, min(8192, 2_000_000 // total))
        fixed = fixed_length_pairs(tok, n, total, seed)
        asyncio.run(eng.entailment(fixed[:64]))  # warm-up (kernels, allocator) at this shape
        sync_cuda()
        _, dt = timed(lambda fixed=fixed: (asyncio.run(eng.entailment(fixed)), sync_cuda()))
        tokens = sum(
            len(tok(p.premise, p.hypothesis, truncation=True, max_length=eng.max_length)["input_ids"]) for p in fixed
        )
        tflops = 2 * params * tokens / dt / 1e12
        rows.append({"tokens_per_pair": total, "pairs": n, "pairs_s": n / dt, "tflops": tflops,
                     "peak_share": tflops / peak_tflops, "encoder_params_m": params / 1e6})  # fmt: skip
    return rows


def gpu_fixed_lengths(eng: TransformersNLI, tok: Any, args: argparse.Namespace) -> None:
    rows = fixed_length_rates(eng, tok, peak_tflops=args.peak_tflops, seed=args.seed)
    print(f"\nGPU fixed lengths (bf16, encoder params {rows[0]['encoder_params_m']:.1f}M, "
          f"peak {args.peak_tflops} TFLOP/s)")  # fmt: skip
    print(f"{'tokens/pair':>11s} {'pairs/s':>9s} {'TFLOP/s':>8s} {'% peak':>7s}")
    for r in rows:
        print(f"{r['tokens_per_pair']:11.0f} {r['pairs_s']:9.1f} {r['tflops']:8.1f} {100 * r['peak_share']:6.1f}%")


if __name__ == "__main__":
    sys.exit(main())
