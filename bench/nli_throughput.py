"""NLI throughput: our engine against sentence-transformers CrossEncoder, same model, same process.

    python bench/nli_throughput.py                       # CPU, 2,000 pairs, random all-MiniLM-L6-v2 shape
    python bench/nli_throughput.py --model-shape deberta-v3-small --pairs 500 --quantize int8
    python bench/nli_throughput.py --device cuda --model-shape deberta-v3-large --random-weights

Runs (a) CrossEncoder.predict one pair at a time (how NLICV's released code scores), (b)
CrossEncoder.predict with batch_size 32 (sentence-transformers sorts a call's pairs by character
length itself), (b') CrossEncoder with the pairs sorted by token count first and each batch of
``--ce-batches`` sizes one predict call (its fastest mode: no padding across lengths), (c) our
TransformersNLI (length-sorted buckets under a padded-token budget) and, with --quantize int8,
(d) the same with int8 dynamic quantization. The pairs are cut into ``--rounds`` chunks and the
methods take turns on each chunk (interleaved, the order rotating), so load on a shared machine
hits every method alike. Prints each method's pairs/s (median and range over the rounds), each
round's ratio of ours to every CrossEncoder mode and to the fastest of them (median and range), and
the largest |P(entailment) difference| from (a). Pairs are synthetic word sequences with premise
lengths spread over 10-400 tokens. The default model is a random-weight model of
all-MiniLM-L6-v2's shape (BERT, 6 layers, hidden 384; the NLI engine of bench/microbatch.py's real
rows) built on the fly with the MiniLM tokenizer (reward_server.backends.tiny_models); throughput
does not depend on the weight values. On CUDA it also reports pairs/s at 128/256/512 tokens per pair
and the share of the bf16 peak (--peak-tflops, H200 ~790 dense), FLOPs estimated as 2 x encoder
params x tokens.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stats import Trials, machine_line, rounds

from reward_server.backends.base import NLIPair
from reward_server.backends.settings import TransformersNLISettings
from reward_server.backends.tiny_models import build_tiny_nli_model
from reward_server.backends.transformers_nli import TransformersNLI


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", help="HF id or local folder (default: random weights, see --model-shape)")
    ap.add_argument(
        "--model-shape", default="minilm-l6", choices=["tiny", "minilm-l6", "deberta-v3-small", "deberta-v3-large"]
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
    ap.add_argument("--ce-batches", default="8,16,32", help="batch sizes of (b'), the CrossEncoder "
                    "on token-sorted pairs")
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

    def ce_sorted(batch: int) -> Any:
        def run(chunk: list[NLIPair]) -> list[float]:
            lengths = [len(ids) for ids in tok([p.premise for p in chunk], [p.hypothesis for p in chunk],
                                                truncation=True, max_length=ours.max_length)["input_ids"]]
            order = sorted(range(len(chunk)), key=lengths.__getitem__)
            out = [0.0] * len(chunk)
            for lo in range(0, len(order), batch):
                idx = order[lo:lo + batch]
                logits = ce.predict([(chunk[i].premise, chunk[i].hypothesis) for i in idx],
                                    batch_size=len(idx), show_progress_bar=False)
                for i, p in zip(idx, softmax_col(np.asarray(logits, dtype=np.float64).reshape(len(idx), -1), ent),
                                strict=True):
                    out[i] = float(p)
            return out

        return run

    methods: list[tuple[str, Any]] = []
    if not args.skip_single:
        methods.append(("(a) CrossEncoder one pair at a time", ce_single))
    methods.append(("(b) CrossEncoder batch_size=32", ce_batch))
    for b in [int(x) for x in args.ce_batches.split(",") if x.strip()]:
        methods.append((f"(b') CrossEncoder, token-sorted, batch {b}", ce_sorted(b)))
    n_ce = len(methods)
    methods.append((f"(c) ours, token budget {ours.token_budget}", ours_fn(ours)))
    for b in [int(x) for x in args.token_budgets.split(",") if x.strip()]:
        methods.append((f"(c) ours, token budget {b}", ours_fn(engine(False, b))))
    if args.quantize == "int8":
        q = engine(True, args.token_budget)
        methods.append((f"(d) ours + int8 dynamic quant, budget {q.token_budget}", ours_fn(q)))
    for _, fn in methods:  # warm-up
        fn(pairs[:4])
    trials = Trials()
    probs: dict[str, list[float]] = {label: [] for label, _ in methods}
    fns = dict(methods)
    size = -(-len(pairs) // max(1, args.rounds))
    chunks = [pairs[lo : lo + size] for lo in range(0, len(pairs), size)]
    for r, label in rounds(list(fns), len(chunks)):
        chunk = chunks[r]
        t = time.perf_counter()
        p = fns[label](chunk)
        trials.add(label, r, {"pairs_s": len(chunk) / (time.perf_counter() - t)})
        trials.rows[label][r]["p"] = p
        # each round's rate as it comes, so a run cut short by a timeout still shows its rounds
        print(f"  round {r + 1} {label}: {trials.rows[label][r]['pairs_s']:.2f} pairs/s", file=sys.stderr,
              flush=True)
    for label in fns:  # P(entailment) in the pairs' order
        probs[label] = [x for r in sorted(trials.rows[label]) for x in trials.rows[label][r]["p"]]
    ref = np.array(probs[methods[0][0]])
    for r in range(len(chunks)):  # each round's fastest CrossEncoder mode
        best = max(trials.rows[label][r]["pairs_s"] for label, _ in methods[:n_ce])
        for label, _ in methods:
            trials.rows[label][r]["x_best_ce"] = trials.rows[label][r]["pairs_s"] / best
    print(f"\n{len(chunks)} interleaved rounds of {size} pairs; median [range] over the rounds\n")
    print("| run | pairs/s | x (a) one at a time | x (b) batch 32 | x fastest CrossEncoder mode of the round | "
          "max abs dp vs (a) |\n|---|---:|---:|---:|---:|---:|")
    for label, _ in methods:
        diff = float(np.max(np.abs(np.array(probs[label]) - ref)))
        xa = trials.ratio(label, methods[0][0], "pairs_s").fmt(2) if not args.skip_single else "-"
        xb = trials.ratio(label, "(b) CrossEncoder batch_size=32", "pairs_s").fmt(2)
        print(f"| {label} | {trials.spread(label, 'pairs_s').fmt(2)} | {xa} | {xb} | "
              f"{trials.spread(label, 'x_best_ce').fmt(2)} | {diff:.1e} |")
    print(f"\nmodel: {args.model or args.model_shape + ' shape, random weights'}; {machine_line()}")
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
