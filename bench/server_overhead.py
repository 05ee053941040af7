"""What hosting costs: the same fake-engine items scored in-process, through gRPC, and through
gRPC + Ray Serve (engines as deployments, @serve.batch re-batching).

    python bench/server_overhead.py                 # 10,000 items, 64 concurrent calls
    python bench/server_overhead.py --items 2000 --judge-replicas 2
    python bench/server_overhead.py 2>/dev/null     # the table only (Ray logs go to stderr)

Scenarios, each on the same items (half rubric_score -> judge, half nli_constraints -> NLI):
  (a) baseline: RewardService.score in-process, raw fake engines, 256-item calls in sequence
  (b) gRPC -> in-process engines (batched), 64 concurrent single-item calls
  (c) gRPC -> Ray Serve -> engines, 64 concurrent single-item calls
  (d) gRPC -> Ray Serve -> engines, 256-item calls, up to 64 concurrent
(c) and (d) run twice: with the ingress batcher bypassed (every engine call the service makes
is its own Ray call; only the replicas' @serve.batch joins queued calls) and on (the default:
engines.<kind>.batching, wait_ms=2, merges concurrent calls before the Ray hop).
Prints items/s, p50/p99 per call, the batch sizes the Ray replicas formed (from their own
records), every result checked against its item, and the overhead ratios vs (a).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _workload import make_items, pct

from reward_server import domain as d
from reward_server.app import build_service, start_app
from reward_server.backends.fake import FakeJudge, FakeNLI
from reward_server.client import AsyncRewardClient
from reward_server.config import RewardServerConfig, load_config
from reward_server.rpc.backend import LocalBackend
from reward_server.rpc.server import create_server
from reward_server.service import RewardService

FAKE = "engines={judge: {kind: fake}, nli: {kind: fake}}"

Scorer = Callable[[Sequence[d.ScoreItem]], Awaitable[list[d.ItemResult]]]


async def run(
    name: str, score: Scorer, items: list[d.ScoreItem], *, per_call: int, concurrency: int
) -> dict[str, Any]:
    calls = [items[i : i + per_call] for i in range(0, len(items), per_call)]
    sem = asyncio.Semaphore(concurrency)
    lat: list[float] = []
    results: list[list[d.ItemResult]] = [[] for _ in calls]

    errors: list[str] = []

    async def one(k: int) -> None:
        async with sem:
            t = time.perf_counter()
            try:
                results[k] = await score(calls[k])
            except Exception as e:  # counted as failed items, reported below
                errors.append(f"{type(e).__name__}: {str(e)[:160]}")
                results[k] = []
            lat.append((time.perf_counter() - t) * 1000)

    await asyncio.gather(*(one(k) for k in range(min(len(calls), 8))))  # warm-up
    lat.clear()
    errors.clear()
    start = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(len(calls))))
    wall = time.perf_counter() - start
    bad = sum(
        r.item_id != it.item_id or r.status is not d.ItemStatus.OK
        for call, res in zip(calls, results, strict=True)
        for it, r in zip(call, res, strict=False)  # a failed call has none (counted below)
    ) + sum(len(c) - len(r) for c, r in zip(calls, results, strict=True))
    row = {"name": name, "items_s": len(items) / wall, "p50": pct(lat, 0.5),
           "p99": pct(lat, 0.99), "wall": wall, "bad": bad}
    print(f"{name:<48} {row['items_s']:>10.0f} items/s   p50 {row['p50']:>8.1f} ms   "
          f"p99 {row['p99']:>8.1f} ms   wall {wall:6.1f} s   mismatched/failed {bad}", flush=True)
    for err in sorted(set(errors))[:3]:
        print(f"    failed call: {err}", flush=True)
    return row


async def grpc_scorer(config: RewardServerConfig, service: RewardService) -> tuple[Any, Any]:
    server, port = create_server(config.server, LocalBackend(service, config.server))
    await server.start()
    client = AsyncRewardClient(f"127.0.0.1:{port}", timeout_s=600)
    return server, client


def sizes_since(now: dict[str, Any], before: dict[str, Any], method: str) -> list[int]:
    out: list[int] = []
    for rid, stats in now.items():
        seen = len(before.get(rid, {}).get("batch_sizes", {}).get(method, []))
        out += stats["batch_sizes"].get(method, [])[seen:]
    return out


def describe(sizes: list[int]) -> str:
    if not sizes:
        return "none recorded"
    return (f"{len(sizes)} batches, mean {statistics.mean(sizes):.1f}, p50 {pct(sizes, 0.5)}, "
            f"max {max(sizes)}, singletons {sum(s == 1 for s in sizes)}")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--judge-replicas", type=int, default=1)
    ap.add_argument("--nli-replicas", type=int, default=1)
    ap.add_argument("--max-in-flight", type=int, default=None,
                    help="engines.<kind>.batching.max_in_flight on Ray (default: 1 per replica)")
    args = ap.parse_args()
    items = make_items(args.items)
    print(f"{args.items} items, concurrency {args.concurrency}, {os.cpu_count()} CPUs", flush=True)

    # (a) baseline
    service = RewardService(judge=FakeJudge(), nli=FakeNLI())
    a = await run("(a) in-process service, 256-item calls", service.score, items,
                  per_call=256, concurrency=1)

    # (b) gRPC -> in-process engines
    app = await start_app(load_config(overrides=["server.port=0", FAKE], env={}))
    client = AsyncRewardClient(app.target, timeout_s=600)
    b = await run("(b) gRPC -> in-process engines, 1-item calls", client.score, items,
                  per_call=1, concurrency=args.concurrency)
    await client.close()
    await app.stop(grace=1.0, drain_delay=0)

    # (c), (d) gRPC -> Ray Serve -> engines
    from reward_server.serving import start_engines

    ray_cfg = load_config(overrides=[
        "server.port=0", FAKE, "serving.mode=ray", "serving.ray.app_prefix=bench",
        f"serving.ray.local_num_cpus={max(2, os.cpu_count() or 2)}",
        "serving.ray.judge.num_cpus=0", "serving.ray.nli.num_cpus=0",
        f"serving.ray.judge.min_replicas={args.judge_replicas}",
        f"serving.ray.judge.max_replicas={args.judge_replicas}",
        f"serving.ray.nli.min_replicas={args.nli_replicas}",
        f"serving.ray.nli.max_replicas={args.nli_replicas}",
        # throughput, not backpressure, is measured here: with the batcher bypassed one
        # 256-item Score call becomes ~256 engine calls, far past the default queue bound
        "serving.ray.judge.max_queued_requests=1000000", "serving.ray.nli.max_queued_requests=1000000",
        *([f"engines.{k}.batching.max_in_flight={args.max_in_flight}" for k in ("judge", "nli")]
          if args.max_in_flight else []),
    ], env={})
    engines: Any = await asyncio.to_thread(start_engines, ray_cfg.engines, ray_cfg.serving)
    try:
        rows = {}
        assert engines.ray_nli is not None
        for coalesce in ("off", "on"):
            if coalesce == "off":
                service = RewardService(judge=engines.ray_judge, nli=engines.ray_nli)
            else:
                service = build_service(ray_cfg, engines)
            server, client = await grpc_scorer(ray_cfg, service)
            for label, per_call in (("1-item", 1), ("256-item", 256)):
                before = {k: await engines.batch_stats(k) for k in ("judge", "nli")}
                tag = ("(c)" if per_call == 1 else "(d)") + f" coalesce {coalesce}"
                rows[tag] = await run(f"{tag}: gRPC->Ray Serve, {label} calls",
                                      client.score, items, per_call=per_call,
                                      concurrency=args.concurrency)
                now = {k: await engines.batch_stats(k) for k in ("judge", "nli")}
                print("    judge replicas' p_yes batches:    "
                      f"{describe(sizes_since(now['judge'], before['judge'], 'p_yes'))}")
                print("    NLI replicas' entailment batches: "
                      f"{describe(sizes_since(now['nli'], before['nli'], 'entailment'))}")
            await client.close()
            await server.stop(grace=1.0, drain_delay=0)
    finally:
        await asyncio.to_thread(engines.shutdown)

    print("\nthroughput ratio vs (a) (items/s of (a) / items/s of x):")
    for row in (b, *rows.values()):
        print(f"  {row['name']:<48} x{a['items_s'] / row['items_s']:.2f}")
    c_on, c_off = rows["(c) coalesce on"], rows["(c) coalesce off"]
    d_on, d_off = rows["(d) coalesce on"], rows["(d) coalesce off"]
    print(f"Ray hop, 1-item calls, coalescing on: throughput (b)/(c) x"
          f"{b['items_s'] / c_on['items_s']:.2f}, p50 latency (c)/(b) x{c_on['p50'] / b['p50']:.2f}")
    print(f"ingress batcher on vs off: 1-item calls x{c_on['items_s'] / c_off['items_s']:.2f}"
          f" items/s, 256-item calls x{d_on['items_s'] / d_off['items_s']:.2f} items/s")


if __name__ == "__main__":
    asyncio.run(main())
