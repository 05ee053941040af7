"""How much the judge template moves p_yes: the shipped PARL eval examples judged under every template.

For every (method, sample, rule) of ``reward_server/eval/examples/parl`` (each user's rules in
``rubrics.jsonl`` on each ``predictions/<method>.jsonl`` text), p_yes under each judge template
(parl-released, parl-v1, parl-v2), full prompts (no prefix sharing), on the local SmolLM2-135M
judge (transformers, fp32, CPU). Prints, against parl-released: mean and max |Δp_yes|, how many
judgments cross the threshold (0.5), and the pooled rubric-level accuracy per method and template.
``--earlier-labels`` also judges parl-v1/v2 with the Amazon context labels of their time
(``[Review Rating]``/``[Review Title]``, trainer.data.loaders ``context_labels="short"``): what a
run of those templates saw. SmolLM2 is a plumbing judge: the numbers show that the wording moves
p_yes, not which wording is better.

    flock /tmp/cpu-heavy.lock .venv/bin/python bench/judge_templates.py [--earlier-labels]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from reward_server.backends.base import JudgePrompt
from reward_server.backends.smollm2 import local_smollm2_path
from reward_server.backends.transformers_judge import TransformersJudge
from reward_server.domain import Task
from reward_server.eval.parl_io import read_methods, read_rubrics
from reward_server.rubric.settings import TEMPLATE_VERSIONS, TemplateVersion
from reward_server.rubric.templates import judge_prompts

EXAMPLES = Path(__file__).resolve().parents[1] / "reward_server" / "eval" / "examples" / "parl"
THRESHOLD = 0.5


def earlier_labels(context: str, task: Task) -> str:
    """An Amazon context in the labels parl-v1/v2 runs had (trainer.data.loaders, "short")."""
    if task != Task.AMAZON:
        return context
    return context.replace("[Output Review Rating]:", "[Review Rating]:").replace(
        "[Output Review Title]:", "[Review Title]:"
    ).rstrip("\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=Path, default=EXAMPLES, help="a PARL eval folder (rubrics.jsonl, predictions/)")
    ap.add_argument("--earlier-labels", action="store_true", help="also parl-v1/v2 with their time's Amazon labels")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--batch", type=int, default=16, help="prompts per forward pass")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    rubrics = read_rubrics(args.examples / "rubrics.jsonl")
    methods = read_methods(args.examples / "predictions", "gt")
    judge = TransformersJudge(str(local_smollm2_path()), device="cpu", forward_batch_size=args.batch,
                              model_id="smollm2-local")  # fmt: skip
    variants: list[tuple[str, TemplateVersion, bool]] = [(t, t, False) for t in TEMPLATE_VERSIONS]
    if args.earlier_labels:
        variants += [(f"{t} (earlier labels)", t, True) for t in TEMPLATE_VERSIONS if t != "parl-released"]
    p: dict[str, list[float]] = {}
    owner: list[str] = []  # method of each judgment, in order
    for name, template, earlier in variants:
        prompts: list[JudgePrompt] = []
        owner.clear()
        for method, samples in methods.items():
            for s in samples:
                ur = rubrics.get(s.key[0])
                if ur is None:
                    continue
                ctx = earlier_labels(s.context, ur.task) if earlier else s.context
                prompts += judge_prompts(ctx, s.text, ur.rules, ur.task, template=template)
                owner += [method] * len(ur.rules)
        t0 = time.perf_counter()
        p[name] = judge.p_yes_sync(prompts, share_prefix=False)
        print(f"{name}: {len(prompts)} judgments in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    base = p["parl-released"]
    print(f"judge smollm2-local (SmolLM2-135M-Instruct, fp32 CPU), {len(base)} judgments, full prompts, "
          f"examples {args.examples}")  # fmt: skip
    print("| template | vs | mean \\|Δp_yes\\| | max \\|Δp_yes\\| | cross 0.5 | mean p_yes |")
    print("|---|---|---:|---:|---:|---:|")
    pairs = [(n, "parl-released") for n, _, _ in variants if n != "parl-released"] + [("parl-v2", "parl-v1")]
    for a, b in pairs:
        d = [abs(x - y) for x, y in zip(p[a], p[b], strict=True)]
        cross = sum(1 for x, y in zip(p[a], p[b], strict=True) if (x > THRESHOLD) != (y > THRESHOLD))
        print(f"| {a} | {b} | {sum(d) / len(d):.3f} | {max(d):.3f} | {cross}/{len(d)} | {sum(p[a]) / len(d):.3f} |")
    print(f"| parl-released | - | - | - | - | {sum(base) / len(base):.3f} |")
    print("\nrubric-level pooled accuracy (share of judgments with p_yes > 0.5) per method")
    names = [n for n, _, _ in variants]
    print("| method | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for method in methods:
        idx = [i for i, m in enumerate(owner) if m == method]
        cells = [f"{sum(1 for i in idx if p[n][i] > THRESHOLD) / len(idx):.3f}" if idx else "-" for n in names]
        print(f"| {method} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
