"""What ``service.call_judgments_in_flight`` costs a large Score call: the same call scored in
process, on the fake engines behind the server's own batching, with the default window and with
the whole call in flight at once, interleaved round by round in one run.

    python bench/large_call.py                       # 1,024 items x 64 rules, 12 rounds
    python bench/large_call.py --items 256 --rules 64 --rounds 20 --window 512

Prints each setting's median, lowest and highest latency (the first round of each left out as
warm-up), the ratio of the medians, and the process's RSS before and after (both services share
the process, so the RSS is the two together: run with ``--only`` to see one alone).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reward_server import domain as d
from reward_server.app import build_service
from reward_server.cli import FAKE_ENGINES
from reward_server.config import load_config
from reward_server.service import RewardService
from reward_server.serving.start import start_engines

ALL_AT_ONCE = 10**9


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024


def service(window: int | None) -> RewardService:
    overrides = [FAKE_ENGINES]
    if window is not None:
        overrides.append(f"service.call_judgments_in_flight={window}")
    config = load_config(None, overrides=overrides)
    return build_service(config, start_engines(config.engines, config.serving))


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=1024)
    ap.add_argument("--rules", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--window", type=int, default=None, help="the windowed setting (default: the server's)")
    ap.add_argument("--only", choices=["window", "all"], default=None, help="run one setting alone")
    args = ap.parse_args()
    before = rss_mb()
    settings = {"window": args.window, "all": ALL_AT_ONCE}
    services = {k: service(w) for k, w in settings.items() if args.only in (None, k)}
    rules = tuple(f'The text mentions "word{k}" in a sentence of its own.' for k in range(args.rules))
    items = [d.ScoreItem(f"i{i}", d.RubricScoreSpec("ctx", f"word{i % 5} " + "x" * 120, rules))
             for i in range(args.items)]
    took: dict[str, list[float]] = {k: [] for k in services}
    first: dict[str, list[d.ItemResult]] = {}
    for _ in range(args.rounds):
        for name, s in services.items():
            batch = await s.validate(items)
            t = time.perf_counter()
            out = await s.score(batch)
            took[name].append(time.perf_counter() - t)
            rewards = [r.reward for r in out]
            assert rewards == [r.reward for r in first.setdefault(name, out)], "results changed"
    if len(first) == 2:
        assert [r.reward for r in first["window"]] == [r.reward for r in first["all"]], "window changed results"
    judgments = args.items * args.rules
    print(f"{args.items} items x {args.rules} rules = {judgments:,} judgments per call, {args.rounds} rounds")
    for name, s in services.items():
        x = sorted(took[name][1:])
        label = f"window {s.call_window:,}" if name == "window" else "all at once"
        print(f"  {label:>16}: median {1000 * statistics.median(x):7.1f} ms, lowest {1000 * x[0]:7.1f}, "
              f"highest {1000 * x[-1]:7.1f}")
    if len(services) == 2:
        ratio = statistics.median(took["window"][1:]) / statistics.median(took["all"][1:])
        print(f"  window / all at once (medians): {ratio:.2f}")
    print(f"  RSS of this process: {before:.0f} MB before, {rss_mb():.0f} MB after")


if __name__ == "__main__":
    asyncio.run(main())
