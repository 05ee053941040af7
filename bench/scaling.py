"""Scaling of the gRPC ingress with fake engines (what the server itself costs): items/s, per-call
p50/p99 and the server's CPU per item at concurrency 1/16/64/256 x items per call 1/32/256.

    python bench/scaling.py                  # each cell: >= 2,000 calls or >= 30 s, whichever first
    python bench/scaling.py --quick          # each cell: >= 200 calls or >= 3 s (a smoke run)
    python bench/scaling.py --set service.admission.enabled=true   # any server override
    python bench/scaling.py --per-call 1 256 --concurrency 64 256 --min-s 10 --runs 5   # the ratios' spread

Every cell runs at least 4 x concurrency calls unless its time budget ends it first.

The server runs in its own process (``reward-server serve --fake``), so its CPU (user+system,
all threads, from /proc via psutil) is measured apart from this client's. Admission control is
off by default (a 256 x 256 cell holds 65,536 items in flight, over the default limit: with it
on, the cell measures pushback waits, not the server's per-item cost). Each cell runs closed
loop: ``concurrency`` callers send calls back to back until the cell's budget is spent; every
result is checked (id, OK). Items: half rubric_score -> judge, half nli_constraints -> NLI.
The last lines print, per item size, items/s at concurrency 256 over 64 (flat: >= 0.95); with
``--runs N`` every cell runs N times, interleaved (the order rotating), and the ratios are the
median and range over the runs' pairs. The engines are the fakes: the measure is the server's own
per-item cost (a real CPU engine's items/s is the engine's, at any concurrency).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stats import Trials, machine_line, rounds
from _workload import free_port, make_items, pct

from reward_server import domain as d
from reward_server.client import AsyncRewardClient

CONCURRENCY = (1, 16, 64, 256)
PER_CALL = (1, 32, 256)


async def start_server(
    overrides: list[str], gc_gen0: int | None = None, pythonpath: str | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    args = ["serve", "--fake", "--port", str(port), "--set", "server.drain_delay_s=0",
            "--set", "service.admission.enabled=false", *(a for o in overrides for a in ("--set", o))]
    # --gc-gen0: the same server with Python's cyclic GC tuned (an experiment, not a setting)
    # (serve sets reward_server.app.SERVER_GC_THRESHOLDS once started: replace those)
    tune = ("" if gc_gen0 is None else
            f"import reward_server.app as a; a.SERVER_GC_THRESHOLDS = ({gc_gen0}, 50, 100); ")
    cmd = [sys.executable, "-c", f"{tune}import sys; from reward_server.cli import main; "
           f"sys.exit(main({args!r}))"]
    env = dict(os.environ)
    if pythonpath:  # A/B: the server from another checkout of reward_server
        env["PYTHONPATH"] = pythonpath
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    target = f"127.0.0.1:{port}"
    async with AsyncRewardClient(target, timeout_s=60) as c:
        for _ in range(600):
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode}: {' '.join(cmd)}")
            try:
                if await c.health(timeout_s=1.0) == "SERVING":
                    return proc, target
            except Exception:  # not up yet
                pass
            await asyncio.sleep(0.1)
    proc.kill()
    raise RuntimeError("the server did not come up within 60 s")


def cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


async def cell(client: AsyncRewardClient, server: psutil.Process, pool: list[d.ScoreItem], *,
               per_call: int, concurrency: int, min_calls: int, min_s: float) -> dict[str, Any]:
    calls = [pool[i:i + per_call] for i in range(0, len(pool) - per_call + 1, per_call)]
    # at least 4 waves: with fewer calls than callers (--quick's 200 at concurrency 256) the
    # cell measured one burst (every call sent at once, the wall ending with the slowest), not
    # the steady rate; the time budget still ends a cell of slow calls
    min_calls = max(min_calls, 4 * concurrency)
    lat: list[float] = []
    bad = sent = 0
    stop_at = 0.0

    async def caller(k: int) -> None:
        nonlocal bad, sent
        while sent < min_calls and time.perf_counter() < stop_at:
            batch = calls[(k + sent) % len(calls)]
            sent += 1
            t = time.perf_counter()
            try:
                res = await client.score(batch)
                bad += sum(r.item_id != i.item_id or r.status is not d.ItemStatus.OK
                           for r, i in zip(res, batch, strict=True))
            except Exception:  # counted as failed items
                bad += len(batch)
            lat.append((time.perf_counter() - t) * 1000)

    stop_at = time.perf_counter() + 1.0  # warm-up: about a second, at most 16 callers
    await asyncio.gather(*(caller(k) for k in range(min(concurrency, 16))))
    lat.clear()
    bad = sent = 0
    srv, here = cpu_s(server), time.process_time()
    start = time.perf_counter()
    stop_at = start + min_s
    await asyncio.gather(*(caller(k) for k in range(concurrency)))
    wall = time.perf_counter() - start
    n = len(lat) * per_call
    row = {"per_call": per_call, "concurrency": concurrency, "calls": len(lat), "items_s": n / wall,
           "p50": pct(lat, 0.5), "p99": pct(lat, 0.99), "wall": wall, "bad": bad,
           "server_ms_item": 1000 * (cpu_s(server) - srv) / n,
           "client_ms_item": 1000 * (time.process_time() - here) / n}
    # share of the wall each process was on a CPU (1.0 = one core all the time): a server below
    # ~1.0 while items/s falls is waiting on its callers, not doing more work per item
    row["server_busy"] = row["server_ms_item"] * n / 1000 / wall
    row["client_busy"] = row["client_ms_item"] * n / 1000 / wall
    print(f"{per_call:>4}-item calls x{concurrency:<4} {row['calls']:>6} calls {row['items_s']:>9.0f} items/s"
          f"   p50 {row['p50']:>7.1f} ms   p99 {row['p99']:>7.1f} ms   server CPU "
          f"{row['server_ms_item']:.3f} ms/item   client CPU {row['client_ms_item']:.3f} ms/item   "
          f"busy server {row['server_busy']:.2f} client {row['client_busy']:.2f}   failed {bad}", flush=True)
    return row


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="each cell >= 200 calls or >= 3 s")
    ap.add_argument("--min-calls", type=int, default=None, help="calls per cell (default 2,000)")
    ap.add_argument("--min-s", type=float, default=None, help="seconds per cell (default 30)")
    ap.add_argument("--gc-gen0", type=int, default=None,
                    help="run the server with gc.set_threshold(N, 50, 100) after its "
                    "gc.freeze() (default: serve's own, reward_server.app.SERVER_GC_THRESHOLDS)")
    ap.add_argument("--server-pythonpath", default=None,
                    help="PYTHONPATH of the server process (A/B against another checkout)")
    ap.add_argument("--per-call", type=int, nargs="+", default=list(PER_CALL))
    ap.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY))
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="a server config override (repeatable)")
    ap.add_argument("--runs", type=int, default=1, help="interleaved runs of every cell (ratios: "
                    "median and range over the runs)")
    args = ap.parse_args()
    min_calls = args.min_calls or (200 if args.quick else 2000)
    min_s = args.min_s or (3.0 if args.quick else 30.0)
    pool = make_items(4096)
    proc, target = await start_server(args.overrides, args.gc_gen0, args.server_pythonpath)
    server = psutil.Process(proc.pid)
    print(f"server pid {proc.pid} at {target}; each cell: {min_calls} calls or {min_s:g} s, whichever "
          f"comes first; server GC {args.gc_gen0 or 'default'}, code from {args.server_pythonpath or 'this checkout'}; "
          f"{os.cpu_count()} CPUs (client and "
          "server share them)", flush=True)
    cells = [(per_call, conc) for per_call in args.per_call for conc in args.concurrency]
    trials = Trials()
    try:
        async with AsyncRewardClient(target, timeout_s=600) as client:
            for run, key in rounds([f"{p}x{c}" for p, c in cells], args.runs):
                per_call, conc = (int(x) for x in key.split("x"))
                trials.add(key, run, await cell(client, server, pool, per_call=per_call, concurrency=conc,
                                                min_calls=min_calls, min_s=min_s))
    finally:
        proc.terminate()
        proc.wait(30)
    print(f"\n{args.runs} interleaved runs (the cells' order rotating); median [range] over the runs\n")
    print("| items/call | concurrency | calls (median) | items/s | p50 ms | p99 ms | server CPU ms/item |"
          " client CPU ms/item | server busy | client busy |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for per_call, conc in cells:
        key = f"{per_call}x{conc}"
        sp = {k: trials.spread(key, k) for k in ("calls", "items_s", "p50", "p99", "server_ms_item",
                                                  "client_ms_item", "server_busy", "client_busy")}
        print(f"| {per_call} | {conc} | {sp['calls'].median:.0f} | {sp['items_s'].fmt(0)} | {sp['p50'].median:.1f} | "
              f"{sp['p99'].median:.1f} | {sp['server_ms_item'].fmt(3)} | {sp['client_ms_item'].median:.3f} | "
              f"{sp['server_busy'].median:.2f} | {sp['client_busy'].median:.2f} |")
    for per_call in args.per_call:
        a, b = f"{per_call}x64", f"{per_call}x256"
        if a not in trials.rows or b not in trials.rows:
            continue
        print(f"{per_call}-item calls: items/s at concurrency 256 / 64 x{trials.ratio(b, a, 'items_s').fmt(2)}"
              f" (target >= 0.95); server CPU per item 256 / 64 x{trials.ratio(b, a, 'server_ms_item').fmt(2)}")
    print(machine_line())

if __name__ == "__main__":
    asyncio.run(main())
