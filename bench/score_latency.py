"""Per-call latency of Score through gRPC (fake engines), against the in-process service call.

    python bench/score_latency.py            # 1,000 calls each of 1 and 256 items
    python bench/score_latency.py --calls 200

Prints p50/p99 per call for (a) RewardService.score in-process on the raw fake engines
(baseline) and (b) the same items through a real server (reward_server.app.start_app: batched
engines, grpc.aio) and AsyncRewardClient on 127.0.0.1, and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from _workload import make_items, pct

from reward_server import domain as d
from reward_server.app import start_app
from reward_server.backends.fake import FakeJudge, FakeNLI
from reward_server.client import AsyncRewardClient
from reward_server.config import load_config
from reward_server.service import RewardService


async def measure(fn, items: list[d.ScoreItem], calls: int) -> list[float]:  # type: ignore[no-untyped-def]
    for _ in range(min(20, calls)):  # warm-up
        await fn(items)
    out = []
    for _ in range(calls):
        t = time.perf_counter()
        await fn(items)
        out.append((time.perf_counter() - t) * 1000)
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=1000)
    args = ap.parse_args()
    config = load_config(overrides=["server.port=0", "engines={judge: {kind: fake}, nli: {kind: fake}}"],
                         env={})
    service = RewardService(judge=FakeJudge(), nli=FakeNLI())
    app = await start_app(config)
    client = AsyncRewardClient(f"127.0.0.1:{app.port}")
    print(f"{'items/call':>10} {'path':<22} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    for n in (1, 256):
        items = make_items(n)
        base = await measure(service.score, items, args.calls)
        grpc_ms = await measure(client.score, items, args.calls)
        for name, xs in (("in-process (baseline)", base), ("gRPC client->server", grpc_ms)):
            print(f"{n:>10} {name:<22} {pct(xs, .5):8.3f} {pct(xs, .99):8.3f} {statistics.mean(xs):8.3f}")
        print(f"{n:>10} {'ratio gRPC/baseline':<22} {pct(grpc_ms, .5) / pct(base, .5):8.2f}x"
              f" {pct(grpc_ms, .99) / pct(base, .99):7.2f}x")
    await client.close()
    await app.stop(grace=1, drain_delay=0)


if __name__ == "__main__":
    asyncio.run(main())
