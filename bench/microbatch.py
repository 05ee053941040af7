"""verl's call pattern (one ``compute_score`` per finished rollout: N concurrent 1-item callers)
with and without client-side micro-batching (:mod:`reward_server.client.coalesce`), against the fake
engines served in-process and on Ray Serve (a local Ray, num_cpus=2), in one run.

    python bench/microbatch.py                    # N=256 callers x 32 calls, repeated for >= 3 s
    python bench/microbatch.py --callers 256 --calls 16 --window-ms 2
    python bench/microbatch.py --no-ray           # in-process only

On Ray it runs the default transport (serving.ray.transport=grpc) with and without
micro-batching, then with it over Ray actor calls (``--no-actor`` skips that row), then with it
on ``serving.ray.layout=service``: replicas that run the whole service, one Ray hop per call
(``--no-service-layout`` skips that row; its replica's CPU is not counted either).
``--ingresses N`` serves the Ray rows from N ingress processes (this one, plus N-1
``reward-server serve`` processes attached to its applications, docs/operations.md); the callers'
client round-robins over them, and the server CPU counts all of them.

The server (``start_app``: gRPC ingress plus engines in this process, or engines on Ray Serve)
runs in this process; the callers run in a child process, as verl's RewardLoopWorker is its own
process: each of N callers awaits ``AsyncRewardClient.score([one item])`` ``--calls`` times in a
row on one shared client, so N calls are in flight at once. Every result is checked (id, OK).
Prints items/s, p50/p99 per call, the server process's CPU per item (on Ray the replicas'
CPU is not counted), the callers' CPU per item, the Score calls refused for load (by limit and
stage) and the engine batches the server formed (per
deployment: how many, mean items; on Ray each is one deployment call), then the ratios: with/without
micro-batching per hosting, and Ray/in-process with it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import make_items, pct, proc_cpu_s

from reward_server import domain as d
from reward_server.app import start_app, tune_gc_for_serving
from reward_server.client import AsyncRewardClient, CoalesceSettings
from reward_server.config import load_config
from reward_server.service_deployment import SEPARATE_THREAD_ENV

FAKE = "engines={judge: {kind: fake}, nli: {kind: fake}}"


async def pattern(client: AsyncRewardClient, items: list[d.ScoreItem], callers: int,
                  min_s: float = 0.0) -> dict[str, Any]:
    """``callers`` concurrent callers, each scoring its share of ``items`` one item per call;
    again (a round) until ``min_s`` seconds have passed."""
    lat: list[float] = []
    bad = 0

    async def caller(mine: list[d.ScoreItem]) -> None:
        nonlocal bad
        for it in mine:
            t = time.perf_counter()
            try:
                (res,) = await client.score([it])
                bad += res.item_id != it.item_id or res.status is not d.ItemStatus.OK
            except Exception:  # counted, reported
                bad += 1
            lat.append((time.perf_counter() - t) * 1000)

    await asyncio.gather(*(caller(items[k:k + 1]) for k in range(min(callers, len(items)))))  # warm-up
    lat.clear()
    bad = 0
    cpu, start = time.process_time(), time.perf_counter()
    rounds = 0
    round_s: list[float] = []
    while not rounds or time.perf_counter() - start < min_s:
        t0 = time.perf_counter()
        await asyncio.gather(*(caller(items[k::callers]) for k in range(callers)))
        round_s.append(time.perf_counter() - t0)
        rounds += 1
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    n = rounds * len(items)
    return {"items_s": n / wall, "p50": pct(lat, 0.5), "p99": pct(lat, 0.99),
            "cpu_ms_item": 1000 * cpu / n, "bad": bad, "wall": wall, "items": n, "rounds": rounds,
            "round_s": round_s}


async def callers(args: argparse.Namespace) -> None:
    """The child process: run the pattern against ``args.client`` and print one JSON row."""
    items = make_items(args.callers * args.calls)
    coalesce = CoalesceSettings(window_s=args.window_ms / 1000, max_items=args.max_items)
    async with AsyncRewardClient(args.client, timeout_s=600,
                                 coalesce=coalesce if args.mode == "on" else None) as client:
        row = await pattern(client, items, args.callers, args.min_s)
        row["score_calls"] = client._coalescer.calls_sent if client._coalescer else None
    print(json.dumps(row), flush=True)


def _batches() -> dict[str, tuple[float, float]]:
    """Engine batches formed in this process so far, per deployment: (count, items)."""
    from prometheus_client import REGISTRY

    out = {}
    for dep in ("judge", "nli", "nli_token_counts"):
        labels = {"deployment": dep}
        count = REGISTRY.get_sample_value("reward_server_batch_items_count", labels) or 0.0
        items = REGISTRY.get_sample_value("reward_server_batch_items_sum", labels) or 0.0
        out[dep] = (count, items)
    return out


def _refusal_stages() -> dict[str, float]:
    """Refusals so far by limit and stage (where admission refused: docs/metrics.md)."""
    from prometheus_client import REGISTRY

    out: dict[str, float] = {}
    for metric in REGISTRY.collect():
        if metric.name == "reward_server_admission_refused":
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    key = f"{sample.labels['limit']}/{sample.labels['stage']}"
                    out[key] = out.get(key, 0.0) + sample.value
    return out


def _refused() -> float:
    """Score calls this process's server has answered RESOURCE_EXHAUSTED so far (the client
    retried them on the server's pushback: they cost time, not results)."""
    from prometheus_client import REGISTRY

    value = REGISTRY.get_sample_value(
        "reward_server_rpc_calls_total",
        {"rpc": "Score", "code": "RESOURCE_EXHAUSTED", "transport": "grpc"})
    return float(value or 0.0)


async def callers_row(target: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run the callers' process (this script with ``--client``) against ``target`` with
    micro-batching ``mode`` and ``args``' callers, calls, window_ms, max_items and min_s; its row."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--client", target, "--mode", mode,
        "--callers", str(args.callers), "--calls", str(args.calls),
        "--window-ms", str(args.window_ms), "--max-items", str(args.max_items),
        "--min-s", str(args.min_s),
        stdout=asyncio.subprocess.PIPE)
    out, _ = await child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"the callers' process failed ({child.returncode})")
    row: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return row


async def scenario(hosting: str, overrides: list[str], args: argparse.Namespace,
                   modes: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """The rows ``modes`` (default ``args.modes``) against a server with ``overrides``."""
    app = await start_app(load_config(overrides=["server.port=0", "server.drain_delay_s=0", FAKE,
                                                 *overrides, *args.overrides], env={}))
    if not args.gc_default:
        tune_gc_for_serving()  # this process is the server: tuned as `reward-server serve` is
    extra = await _extra_ingresses(args.ingresses - 1) if hosting.startswith("gRPC->Ray") else []
    target = ",".join([app.target, *(t for t, _ in extra)])
    rows = {}
    refused = _refused()
    stages = _refusal_stages()
    batches = _batches()
    try:
        for mode in modes or args.modes:
            cpu = time.process_time() + sum(proc_cpu_s(p.pid) for _, p in extra)
            row = rows[mode] = await callers_row(target, mode, args)
            cpu = time.process_time() + sum(proc_cpu_s(p.pid) for _, p in extra) - cpu
            refused_now = _refused()
            row["refused"], refused = refused_now - refused, refused_now
            stages_now = _refusal_stages()
            where = {k: v - stages.get(k, 0.0) for k, v in stages_now.items() if v > stages.get(k, 0.0)}
            stages = stages_now
            batches_now = _batches()
            formed = {dep: (batches_now[dep][0] - batches[dep][0], batches_now[dep][1] - batches[dep][1])
                      for dep in batches}
            batches = batches_now
            n = row["items"]
            row["server_ms_item"] = 1000 * cpu / (n + min(args.callers, n))  # + warm-up items
            sent = row["score_calls"]
            print(f"{hosting:<16} micro-batching {mode:<3}  {row['items_s']:>8.0f} items/s   "
                  f"p50 {row['p50']:>7.1f} ms   p99 {row['p99']:>7.1f} ms   server CPU "
                  f"{row['server_ms_item']:.3f} ms/item   callers' CPU {row['cpu_ms_item']:.3f} ms/item"
                  f"   wall {row['wall']:5.1f} s ({row['rounds']} x {n // row['rounds']} items; rounds "
                  f"{', '.join(f'{r:.2f}' for r in row['round_s'])} s)"
                  f"   failed/mismatched {row['bad']}"
                  + (f"   Score calls {sent} (incl. warm-up)" if sent is not None else "")
                  + f"   refused (RESOURCE_EXHAUSTED, retried) {row['refused']:.0f}"
                  + (" (" + ", ".join(f"{k} {v:.0f}" for k, v in sorted(where.items())) + ")"
                     if where else "")
                  + "   engine batches " + ", ".join(
                      f"{dep} {n:.0f} (mean {items / n:.1f} items)" for dep, (n, items) in formed.items() if n),
                  flush=True)
    finally:
        for _, p in extra:
            p.terminate()  # SIGTERM: a graceful stop
            await p.wait()
        await app.stop(grace=1.0, drain_delay=0)
    return rows


async def _extra_ingresses(n: int) -> list[tuple[str, Any]]:
    """``n`` more ingress processes attached to this process's Ray applications."""
    import ray

    gcs = ray.get_runtime_context().gcs_address
    out = []
    for _ in range(n):
        p = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "reward_server", "serve", "--fake", "--port", "0", "--address", gcs,
            "--set", "serving.ray.deploy=false", "--set", "serving.ray.app_prefix=microbatch",
            "--set", "server.metrics_port=0",
            stdout=asyncio.subprocess.PIPE, env={**os.environ, "RAY_AUTH_MODE": "token"})
        assert p.stdout is not None
        while True:
            line = (await p.stdout.readline()).decode()
            if not line:
                raise RuntimeError("an extra ingress did not start")
            if line.startswith("listening on "):
                out.append(("127.0.0.1:" + line.strip().rsplit(":", 1)[1], p))
                break
    return out


def ratio(a: dict[str, dict[str, Any]] | None, ma: str, b: dict[str, dict[str, Any]] | None,
          mb: str) -> str:
    """items/s of row ``ma`` of ``a`` over row ``mb`` of ``b``."""
    if a is None or b is None or ma not in a or mb not in b:
        return "not run"
    return f"x{a[ma]['items_s'] / b[mb]['items_s']:.2f}"


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--callers", type=int, default=256, help="concurrent 1-item callers (N)")
    ap.add_argument("--calls", type=int, default=32, help="calls per caller, in a row (8: the "
                    "merged rows last under a second, and their ratio varied 3.8-5.3x run to run)")
    ap.add_argument("--min-s", type=float, default=3.0, help="each row repeats its callers' "
                    "calls until this many seconds have passed (the merged rows take about a "
                    "second per 8,192 items: single rounds gave Ray / in-process 0.44-0.79x "
                    "in one afternoon)")
    ap.add_argument("--window-ms", type=float, default=1000 * CoalesceSettings.window_s)
    ap.add_argument("--max-items", type=int, default=CoalesceSettings.max_items)
    ap.add_argument("--no-ray", action="store_true", help="skip the Ray Serve hosting")
    ap.add_argument("--no-local", action="store_true", help="skip the in-process hosting")
    ap.add_argument("--no-actor", action="store_true", help="skip the Ray row with "
                    "serving.ray.transport=actor (Ray actor calls, against the default gRPC path)")
    ap.add_argument("--no-service-layout", action="store_true", help="skip the Ray row with "
                    "serving.ray.layout=service (replicas run the whole service, one hop per call)")
    ap.add_argument("--serve-thread", action="store_true", help="also the layout-service row "
                    "with the replica's service in Serve's user-code thread (Serve's default; the "
                    "hosting's default runs it on the replica's own loop)")
    ap.add_argument("--modes", nargs="+", choices=("off", "on"), default=["off", "on"],
                    help="rows to run (default both; the ratios need both)")
    ap.add_argument("--ingresses", type=int, default=1, help="ingress processes on Ray (the "
                    "first in this process, the others `reward-server serve` attached to its "
                    "applications); the callers' client round-robins over them")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="a server config override (repeatable), e.g. service.admission.enabled=false")
    ap.add_argument("--gc-default", action="store_true",
                    help="leave Python's GC as it is (default: tuned as `reward-server serve` tunes it)")
    ap.add_argument("--client", help=argparse.SUPPRESS)  # the callers' process: the server's target
    ap.add_argument("--mode", choices=("on", "off"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client:
        await callers(args)
        return
    n = args.callers * args.calls
    print(f"{args.callers} concurrent 1-item callers x {args.calls} calls = {n} items per "
          f"round, rounds until {args.min_s:g} s per row; window {args.window_ms:g} ms, "
          f"max {args.max_items} items per merged call; "
          f"{os.cpu_count()} CPUs", flush=True)
    local = None if args.no_local else await scenario("gRPC->in-process", [], args)
    ray = actor = service = thread = None
    ray_base = ["serving.mode=ray", "serving.ray.app_prefix=microbatch", "serving.ray.local_num_cpus=2"]
    on_ray = [*ray_base, "serving.ray.judge.num_cpus=0", "serving.ray.nli.num_cpus=0"]
    if not args.no_ray:
        ray = await scenario("gRPC->Ray Serve", on_ray, args)
        if not args.no_actor and "on" in args.modes:
            actor = await scenario("Ray, actor calls", [*on_ray, "serving.ray.transport=actor"], args,
                                   modes=["on"])
        if not args.no_service_layout and "on" in args.modes:
            one_hop = [*ray_base, "serving.ray.layout=service", "serving.ray.service.num_cpus=0"]
            service = await scenario("Ray, layout service", one_hop, args, modes=["on"])
            if args.serve_thread:
                thread = await scenario("Ray, layout service, Serve's thread", [
                    *one_hop, f"serving.ray.service.env_vars={{{SEPARATE_THREAD_ENV}: '1'}}"],
                    args, modes=["on"])
    print("\n| hosting | micro-batching | items/s | p50 ms | p99 ms | server CPU ms/item | callers' CPU ms/item |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for hosting, rows in (("gRPC -> in-process", local), ("gRPC -> Ray Serve", ray),
                          ("gRPC -> Ray Serve, transport actor", actor),
                          ("gRPC -> Ray Serve, layout service (one hop)", service),
                          ("the same, the replica's service in Serve's user-code thread", thread)):
        for mode, r in (rows or {}).items():
            print(f"| {hosting} | {mode} | {r['items_s']:.0f} | {r['p50']:.1f} | {r['p99']:.1f} | "
                  f"{r['server_ms_item']:.3f} | {r['cpu_ms_item']:.3f} |")
    print(f"\nin-process: with / without micro-batching {ratio(local, 'on', local, 'off')} (target >= 5)")
    print(f"Ray Serve:  with / without micro-batching {ratio(ray, 'on', ray, 'off')}")
    print(f"with micro-batching: Ray / in-process {ratio(ray, 'on', local, 'on')} (target >= 0.8)")
    print(f"with micro-batching on Ray: transport grpc / actor {ratio(ray, 'on', actor, 'on')}")
    print(f"with micro-batching: Ray layout service / in-process {ratio(service, 'on', local, 'on')} "
          "(target >= 0.8)")
    if thread is not None:
        print(f"layout service, Serve's user-code thread / in-process {ratio(thread, 'on', local, 'on')}")

if __name__ == "__main__":
    asyncio.run(main())
