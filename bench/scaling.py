"""Scaling of the hosting path: items/s and per-call p50/p99 through gRPC -> in-process engines
(fake engines: what the server itself costs), vs concurrency and vs items per call.

    python bench/scaling.py                      # 4,000 items per cell
    python bench/scaling.py --items 2000 --ray   # also gRPC -> Ray Serve (starts a local Ray)

Cells: 1-item calls at concurrency 1, 16, 64, 256; then 64 concurrent calls of 1, 8, 64 and 256
items. Each cell runs the same items (half rubric_score -> judge, half nli_constraints -> NLI),
every result checked against its item. The first row is the baseline (RewardService.score
in-process, 256-item calls in sequence); every row prints its ratio to it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import make_items
from server_overhead import FAKE, run

from reward_server.app import start_app
from reward_server.backends.fake import FakeJudge, FakeNLI
from reward_server.client import AsyncRewardClient
from reward_server.config import load_config
from reward_server.service import RewardService

CELLS = [(1, 1), (1, 16), (1, 64), (1, 256), (8, 64), (64, 64), (256, 64)]  # (items per call, concurrency)


async def grid(label: str, overrides: list[str], items: list[Any], base: float) -> list[dict[str, Any]]:
    app = await start_app(load_config(overrides=["server.port=0", FAKE, *overrides], env={}))
    rows = []
    try:
        async with AsyncRewardClient(app.target, timeout_s=600) as client:
            for per_call, conc in CELLS:
                row = await run(f"{label}: {per_call}-item calls x{conc} concurrent", client.score, items,
                                per_call=per_call, concurrency=conc)  # fmt: skip
                row.update(per_call=per_call, concurrency=conc, hosting=label, ratio=row["items_s"] / base)
                rows.append(row)
    finally:
        await app.stop(grace=1.0, drain_delay=0)
    return rows


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=4000)
    ap.add_argument("--ray", action="store_true", help="also through Ray Serve (a local Ray, num_cpus=0 replicas)")
    args = ap.parse_args()
    items = make_items(args.items)
    print(f"{args.items} items per cell, {os.cpu_count()} CPUs", flush=True)
    service = RewardService(judge=FakeJudge(), nli=FakeNLI())
    a = await run("baseline: in-process service, 256-item calls", service.score, items, per_call=256, concurrency=1)
    rows = await grid("gRPC->in-process", [], items, a["items_s"])
    if args.ray:
        ray = ["serving.mode=ray", "serving.ray.app_prefix=scaling", "serving.ray.judge.num_cpus=0",
               "serving.ray.nli.num_cpus=0", f"serving.ray.local_num_cpus={max(2, os.cpu_count() or 2)}"]  # fmt: skip
        rows += await grid("gRPC->Ray Serve", ray, items, a["items_s"])
    print(f"\n| hosting | items/call | concurrency | items/s | p50 ms | p99 ms | x baseline ({a['items_s']:.0f}/s) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['hosting']} | {r['per_call']} | {r['concurrency']} | {r['items_s']:.0f} | {r['p50']:.1f} | "
              f"{r['p99']:.1f} | {r['ratio']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
