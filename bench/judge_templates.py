"""How much the judge template moves p_yes: the shipped PARL eval examples judged under every template.

The judgments of ``reward_server/eval/examples/parl``: each user's rules (``rubrics.jsonl``) on
each of the user's history texts (``history.jsonl``, the validation judgments) and on each
``predictions/<method>.jsonl`` text; p_yes under each judge template (parl-released, parl-v1,
parl-v2) on the local SmolLM2-135M judge (transformers, fp32, CPU; prefix-KV shared, which
matches full prompts within 1e-5, ``--full-prompts`` to run them whole). Prints, against
parl-released: mean and max |Δp_yes|, how many judgments cross the threshold (0.5), the share of
rules that survive validation, and the pooled rubric-level accuracy per method and template.
``--earlier-labels`` also judges parl-v1/v2 with the Amazon context labels of their time
(``[Review Rating]``/``[Review Title]``, trainer.data.loaders ``context_labels="short"``): what a
run of those templates saw. SmolLM2 is a plumbing judge: the numbers show that the wording moves
p_yes, not which wording is better.

    flock /tmp/cpu-heavy.lock .venv/bin/python bench/judge_templates.py [--earlier-labels]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from reward_server.backends.base import JudgePrompt
from reward_server.backends.smollm2 import local_smollm2_path
from reward_server.backends.transformers_judge import TransformersJudge
from reward_server.domain import Task
from reward_server.eval.parl_io import read_history, read_methods, read_rubrics
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
    ap.add_argument("--full-prompts", action="store_true", help="no prefix-KV sharing (slower, same p_yes)")
    ap.add_argument("--save", type=Path, help="JSON file: p_yes per variant, written after each (resumes from it)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    rubrics = read_rubrics(args.examples / "rubrics.jsonl")
    methods = read_methods(args.examples / "predictions", "gt")
    history = read_history(args.examples / "history.jsonl")
    judge = TransformersJudge(str(local_smollm2_path()), device="cpu", forward_batch_size=args.batch,
                              model_id="smollm2-local")  # fmt: skip
    variants: list[tuple[str, TemplateVersion, bool]] = [(t, t, False) for t in TEMPLATE_VERSIONS]
    if args.earlier_labels:
        variants += [(f"{t} (earlier labels)", t, True) for t in TEMPLATE_VERSIONS if t != "parl-released"]
    p: dict[str, list[float]] = json.loads(args.save.read_text()) if args.save and args.save.exists() else {}
    owner: list[str] = []  # method of each judgment, in order
    for name, template, earlier in variants:
        prompts: list[JudgePrompt] = []
        owner.clear()
        texts = [("history", uid, h.context, h.text) for uid, items in history.items() for h in items]
        texts += [(method, s.key[0], s.context, s.text) for method, samples in methods.items() for s in samples]
        for source, uid, context, text in texts:
            ur = rubrics.get(uid)
            if ur is None:
                continue
            ctx = earlier_labels(context, ur.task) if earlier else context
            prompts += judge_prompts(ctx, text, ur.rules, ur.task, template=template)
            owner += [f"{source}:{uid}:{j}" for j in range(len(ur.rules))]
        if name in p and len(p[name]) == len(prompts):
            continue
        t0 = time.perf_counter()
        p[name] = judge.p_yes_sync(prompts, share_prefix=not args.full_prompts)
        print(f"{name}: {len(prompts)} judgments in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        if args.save:
            args.save.write_text(json.dumps(p))
    base = p["parl-released"]
    n_hist = sum(1 for o in owner if o.startswith("history:"))
    print(f"judge smollm2-local (SmolLM2-135M-Instruct, fp32 CPU), {len(base)} judgments ({n_hist} on history "
          f"texts, {len(base) - n_hist} on predictions), {'full prompts' if args.full_prompts else 'prefix shared'}, "
          f"examples {args.examples}")  # fmt: skip
    print("| template | vs | mean \\|Δp_yes\\| | max \\|Δp_yes\\| | cross 0.5 | mean p_yes |")
    print("|---|---|---:|---:|---:|---:|")
    pairs = [(n, "parl-released") for n, _, _ in variants if n != "parl-released"] + [("parl-v2", "parl-v1")]
    for a, b in pairs:
        d = [abs(x - y) for x, y in zip(p[a], p[b], strict=True)]
        cross = sum(1 for x, y in zip(p[a], p[b], strict=True) if (x > THRESHOLD) != (y > THRESHOLD))
        print(f"| {a} | {b} | {sum(d) / len(d):.3f} | {max(d):.3f} | {cross}/{len(d)} | {sum(p[a]) / len(d):.3f} |")
    print(f"| parl-released | - | - | - | - | {sum(base) / len(base):.3f} |")
    names = [n for n, _, _ in variants]
    print("\nrules surviving validation (p_yes > 0.5 on every history text of their user)")
    rules = sorted({o.split(":", 1)[1] for o in owner if o.startswith("history:")})
    for n in names:
        ok = sum(1 for r in rules if all(p[n][i] > THRESHOLD for i, o in enumerate(owner) if o == f"history:{r}"))
        print(f"  {n}: {ok}/{len(rules)}")
    print("\nrubric-level pooled accuracy on the predictions (share of judgments with p_yes > 0.5), all rules")
    print("| method | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for method in methods:
        idx = [i for i, o in enumerate(owner) if o.startswith(f"{method}:")]
        cells = [f"{sum(1 for i in idx if p[n][i] > THRESHOLD) / len(idx):.3f}" if idx else "-" for n in names]
        print(f"| {method} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
