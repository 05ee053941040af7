"""verl's call pattern (one ``compute_score`` per finished rollout: N concurrent 1-item callers)
with and without client-side micro-batching (:mod:`reward_server.client.coalesce`), served in
process and on Ray Serve (a local Ray, num_cpus=2), on the fake engines and on the real small
ones, every variant interleaved with the others in one run.

    python bench/microbatch.py                      # fake and real engines, 5 interleaved rounds
    python bench/microbatch.py --engines fake --runs 7 --service --actor
    python bench/microbatch.py --engines fake --proto wait5 --proto tokens-local
    python bench/microbatch.py --no-ray             # in process only

Variants (each a row): in process without / with micro-batching; on Ray at the default layout
(``serving.ray.layout=engines``, transport grpc) without / with it; with ``--actor`` Ray actor
calls, with ``--service`` the service layout (replicas run the whole service, one hop per call;
``--serve-thread`` adds it in Serve's user-code thread), and ``--proto NAME`` the prototypes of
:data:`PROTOTYPES` (with micro-batching, default layout). Every hosting is started once per
engine set, then the rounds run: every variant once per round, the order rotating each round
(bench/_stats.py), so load on the shared machine hits every variant alike; spreads and ratios are
the median and range over the rounds (each round's ratio from that round's pair of rows).

The engine sets (``--engines``): ``fake`` (deterministic stand-ins: what the hosting costs) and
``real`` (SmolLM2-135M-Instruct judge, and an NLI cross-encoder of all-MiniLM-L6-v2's shape with
random weights and its real tokenizer: no 3-way NLI checkpoint exists offline, and throughput does
not depend on the weights; one torch thread per engine in both hostings, as deploy/cpu_local.yaml).

The servers (``start_app``) run in this process; the callers run in a child process, as verl's
RewardLoopWorker is its own process: each of N callers awaits ``AsyncRewardClient.score([one
item])`` ``--calls`` times in a row on one shared client, so N calls are in flight at once; a row
repeats such rounds of fresh items (texts never repeat) until ``--min-s`` have passed. Every
result is checked (id, OK). Per row: items/s, p50/p99 per call, the CPU per item of EVERY process
doing the work (this process: the gRPC ingress, with the engines when in process; the row's
replicas; Serve's controller and proxy, GCS, raylet and Ray's agents; the callers), the whole
machine's busy cores (other jobs included), and the Score calls refused (RESOURCE_EXHAUSTED,
retried by the client on the server's pushback) or failed and retried.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback Ray, as `serve` sets it
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stats import MachineCpu, ProcessTree, Spread, Trials, machine_line, rounds
from _workload import REAL_LABEL, engines_override, make_items, pct

from reward_server import domain as d
from reward_server.app import start_app, tune_gc_for_serving
from reward_server.client import AsyncRewardClient, CoalesceSettings
from reward_server.config import load_config
from reward_server.service_deployment import SEPARATE_THREAD_ENV

RAY_BASE = ["serving.mode=ray", "serving.ray.local_num_cpus=2"]
ENGINES_LAYOUT = [*RAY_BASE, "serving.ray.judge.num_cpus=0", "serving.ray.nli.num_cpus=0"]
SERVICE_LAYOUT = [*RAY_BASE, "serving.ray.layout=service", "serving.ray.service.num_cpus=0"]
# Prototypes of the default layout's hop (issue 56): each runs with micro-batching on, beside the
# default. Config-level ones are plain overrides.
PROTOTYPES: dict[str, tuple[str, list[str]]] = {
    "wait5": ("larger coalesced engine calls: the ingress batcher waits 5 ms (default 2)",
              ["engines.judge.batching.wait_ms=5", "engines.nli.batching.wait_ms=5"]),
    "inflight2": ("two deployment calls in flight per engine (default one per replica)",
                  ["engines.judge.batching.max_in_flight=2", "engines.nli.batching.max_in_flight=2"]),
}


@dataclass
class Variant:
    label: str
    hosting: str  # key of the hostings dict: one started app per hosting
    mode: str  # micro-batching: on | off


@dataclass
class Hosting:
    overrides: list[str]
    app_kind: str = "ray"  # local | ray
    app: Any = None
    target: str = ""
    apps: list[str] = field(default_factory=list)  # this hosting's Serve application names


async def pattern(client: AsyncRewardClient, callers: int, calls: int, min_s: float,
                  start: int) -> dict[str, Any]:
    """``callers`` concurrent callers, each scoring ``calls`` items one item per call; again (a
    round, fresh items) until ``min_s`` seconds have passed."""
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

    n = callers * calls
    warm = make_items(callers, start)
    await asyncio.gather(*(caller([it]) for it in warm))
    lat.clear()
    bad = 0
    print("start", flush=True)  # the parent starts counting CPU here
    cpu, t_start = time.process_time(), time.perf_counter()
    round_s: list[float] = []
    while not round_s or time.perf_counter() - t_start < min_s:
        items = make_items(n, start + callers + len(round_s) * n)
        t0 = time.perf_counter()
        await asyncio.gather(*(caller(items[k::callers]) for k in range(callers)))
        round_s.append(time.perf_counter() - t0)
    wall = time.perf_counter() - t_start
    items_done = len(round_s) * n
    return {"items_s": items_done / wall, "p50": pct(lat, 0.5), "p99": pct(lat, 0.99),
            "callers_cpu_s": time.process_time() - cpu, "bad": bad, "wall": wall,
            "items": items_done, "rounds": len(round_s)}


async def callers_main(args: argparse.Namespace) -> None:
    """The child process: run the pattern against ``args.client`` and print one JSON row."""
    coalesce = CoalesceSettings(window_s=args.window_ms / 1000, max_items=args.max_items)
    async with AsyncRewardClient(args.client, timeout_s=600,
                                 coalesce=coalesce if args.mode == "on" else None) as client:
        row = await pattern(client, args.callers, args.calls, args.min_s, args.start)
        row["score_calls"] = client._coalescer.calls_sent if client._coalescer else None
    print(json.dumps(row), flush=True)


async def callers_row(target: str, mode: str, *, callers: int, calls: int, min_s: float,
                      start: int, args: argparse.Namespace,
                      on_start: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Run the callers' process (this script with ``--client``) against ``target``; its row.
    ``on_start(pid)`` runs when the callers' warm-up is over and the measured part begins."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--client", target, "--mode", mode, "--callers", str(callers),
        "--calls", str(calls), "--window-ms", str(args.window_ms), "--max-items", str(args.max_items),
        "--min-s", str(min_s), "--start", str(start), stdout=asyncio.subprocess.PIPE)
    assert child.stdout is not None
    last = ""
    async for raw in child.stdout:
        line = raw.decode().strip()
        if line == "start" and on_start is not None:
            on_start(child.pid)
        elif line:
            last = line
    if await child.wait() != 0:
        raise RuntimeError(f"the callers' process failed ({child.returncode})")
    row: dict[str, Any] = json.loads(last)
    return row


def _sample(name: str, labels: dict[str, str]) -> float:
    from prometheus_client import REGISTRY

    return float(REGISTRY.get_sample_value(name, labels) or 0.0)


def _score_codes() -> dict[str, float]:
    """Score calls this process's servers answered so far, by status code."""
    from prometheus_client import REGISTRY

    out: dict[str, float] = {}
    for metric in REGISTRY.collect():
        if metric.name == "reward_server_rpc_calls":
            for s in metric.samples:
                if s.name.endswith("_total") and s.labels.get("rpc") == "Score":
                    out[s.labels["code"]] = out.get(s.labels["code"], 0.0) + s.value
    return out


def _batches() -> dict[str, tuple[float, float]]:
    """Engine calls formed in this process so far, per deployment: (count, items)."""
    return {dep: (_sample("reward_server_batch_items_count", {"deployment": dep}),
                  _sample("reward_server_batch_items_sum", {"deployment": dep}))
            for dep in ("judge", "nli", "nli_token_counts")}


def cpu_groups(by_role: dict[str, float], own_apps: list[str]) -> dict[str, float]:
    """CPU seconds by role -> the columns: ingress, the row's replicas, Ray and Serve's other
    processes (controller, proxy, GCS, raylet, agents), callers."""
    out = {"ingress": 0.0, "replicas": 0.0, "ray": 0.0, "callers": 0.0, "idle_apps": 0.0}
    for name, s in by_role.items():
        if name in ("this process", "ingress"):
            out["ingress"] += s
        elif name == "callers":
            out["callers"] += s
        elif name.startswith("replica "):
            out["replicas" if name[len("replica "):] in own_apps else "idle_apps"] += s
        else:
            out["ray"] += s
    return out


async def run_row(v: Variant, h: Hosting, run: int, args: argparse.Namespace, tree: ProcessTree,
                  start: int) -> dict[str, Any]:
    before: dict[str, Any] = {}

    def on_start(pid: int) -> None:  # the callers' warm-up is over: count from here
        tree.name(pid, "callers")
        before.update(codes=_score_codes(), batches=_batches(), snap=tree.snapshot(),
                      mach=MachineCpu.snapshot())

    calls = args.calls if v.mode == "on" else args.off_calls
    row = await callers_row(h.target, v.mode, callers=args.callers, calls=calls, min_s=args.min_s,
                            start=start, args=args, on_start=on_start)
    snap1, mach1 = tree.snapshot(), MachineCpu.snapshot()
    codes0, batches0, snap0, mach0 = before["codes"], before["batches"], before["snap"], before["mach"]
    by_role = ProcessTree.delta(snap0, snap1)
    # the callers' process has exited (a delta counts the processes alive at its end): its own report
    by_role["callers"] = row["callers_cpu_s"]
    groups = cpu_groups(by_role, h.apps)
    n = row["items"]
    for k, s in groups.items():
        row[f"{k}_ms"] = 1000 * s / n
    # in process, Ray's processes (up for the other rows) do none of the row's work
    doing = ("ingress", "callers") if h.app_kind == "local" else ("ingress", "replicas", "ray", "callers")
    row["total_ms"] = sum(row[f"{k}_ms"] for k in doing)
    row["machine_cores"] = MachineCpu.cores_busy(mach0, mach1)
    codes1, batches1 = _score_codes(), _batches()
    row["codes"] = {c: codes1[c] - codes0.get(c, 0.0) for c in codes1 if codes1[c] > codes0.get(c, 0.0)}
    row["refused"] = row["codes"].get("RESOURCE_EXHAUSTED", 0.0)
    row["retried_other"] = sum(v2 for c, v2 in row["codes"].items() if c not in ("OK", "RESOURCE_EXHAUSTED"))
    formed = {dep: (batches1[dep][0] - batches0[dep][0], batches1[dep][1] - batches0[dep][1])
              for dep in batches1}
    print(f"  round {run + 1} {v.label:<44} {row['items_s']:>8.0f} items/s  p50 {row['p50']:6.1f} "
          f"p99 {row['p99']:7.1f} ms  CPU ms/item ingress {row['ingress_ms']:.3f} replicas "
          f"{row['replicas_ms']:.3f} Ray/Serve {row['ray_ms']:.3f} callers {row['callers_ms']:.3f} "
          f"(idle other apps {row['idle_apps_ms']:.3f})  machine {row['machine_cores']:.2f} cores  "
          f"{row['rounds']} x {row['items'] // row['rounds']} items  bad {row['bad']}  codes "
          f"{ {c: int(x) for c, x in row['codes'].items()} }  engine calls "
          + ", ".join(f"{dep} {c:.0f} (mean {it / c:.1f})" for dep, (c, it) in formed.items() if c),
          flush=True)
    if row["bad"]:
        raise RuntimeError(f"{v.label}: {row['bad']} calls failed or came back mismatched")
    return row


async def start_hostings(hostings: dict[str, Hosting], engines: str, args: argparse.Namespace) -> None:
    """Start every hosting's app (the first Ray one starts the local Ray)."""
    for key, h in hostings.items():
        prefix = f"mb{key.replace('-', '')}"
        overrides = ["server.port=0", "server.drain_delay_s=0", engines, *h.overrides, *args.overrides]
        if any(o.startswith("serving.mode=ray") for o in h.overrides):
            overrides.append(f"serving.ray.app_prefix={prefix}")
            service = any(o == "serving.ray.layout=service" for o in h.overrides)
            h.apps = [f"{prefix}-service"] if service else [f"{prefix}-judge", f"{prefix}-nli"]
        t0 = time.perf_counter()
        h.app = await start_app(load_config(overrides=overrides, env={}))
        h.target = h.app.target
        print(f"started {key} in {time.perf_counter() - t0:.1f} s", flush=True)


async def stop_hostings(hostings: dict[str, Hosting]) -> None:
    started = [h for h in hostings.values() if h.app is not None]
    for h in reversed(started):  # the first Ray app started Ray and stops it last
        await h.app.stop(grace=1.0, drain_delay=0)
        h.app = None


def variants_of(args: argparse.Namespace, engine_set: str) -> tuple[dict[str, Hosting], list[Variant]]:
    hostings: dict[str, Hosting] = {}
    variants: list[Variant] = []
    modes = args.modes
    if not args.no_local:
        hostings["local"] = Hosting([], app_kind="local")
        variants += [Variant(f"in process, micro-batching {m}", "local", m) for m in modes]
    if not args.no_ray:
        hostings["ray"] = Hosting(ENGINES_LAYOUT)
        variants += [Variant(f"Ray engines layout, micro-batching {m}", "ray", m) for m in modes]
        extra: list[tuple[str, str, list[str]]] = []
        if engine_set == "real" and not args.real_extras:
            return hostings, variants
        if args.actor:
            extra.append(("actor", "Ray engines layout, transport actor",
                          [*ENGINES_LAYOUT, "serving.ray.transport=actor"]))
        for name in args.proto:
            extra.append((name, f"Ray engines layout, proto {name}", [*ENGINES_LAYOUT, *PROTOTYPES[name][1]]))
        if args.service:
            extra.append(("service", "Ray service layout (one hop)", SERVICE_LAYOUT))
            if args.serve_thread:
                extra.append(("service-thread", "Ray service layout, Serve's thread", [
                    *SERVICE_LAYOUT, f"serving.ray.service.env_vars={{{SEPARATE_THREAD_ENV}: '1'}}"]))
        for key, label, overrides in extra:
            hostings[key] = Hosting(overrides)
            variants.append(Variant(label, key, "on"))
    return hostings, variants


async def phase(engine_set: str, args: argparse.Namespace) -> tuple[list[Variant], Trials]:
    hostings, variants = variants_of(args, engine_set)
    if engine_set == "real":  # fewer, slower items: a row of a few seconds
        args = argparse.Namespace(**{**vars(args), "callers": args.real_callers, "calls": args.real_calls,
                                     "off_calls": args.real_calls, "min_s": args.real_min_s})
    print(f"\n== engines: {engine_set}{' (' + REAL_LABEL + ')' if engine_set == 'real' else ''}; "
          f"{args.callers} callers x {args.calls} calls per round ({args.off_calls} without "
          f"micro-batching), rows of >= {args.min_s:g} s, {args.runs} interleaved rounds", flush=True)
    trials = Trials()
    tree = ProcessTree(root_role="this process")
    try:
        await start_hostings(hostings, engines_override(engine_set), args)
        if not args.gc_default:
            tune_gc_for_serving()  # this process is the server: tuned as `reward-server serve` is
        snap0, m0 = tree.snapshot(), MachineCpu.snapshot()
        await asyncio.sleep(3)
        idle = cpu_groups(ProcessTree.delta(snap0, tree.snapshot()), [])
        print(f"idle for 3 s with every hosting up: this process {idle['ingress'] / 3:.3f} cores, Ray "
              f"and Serve {(idle['ray'] + idle['idle_apps']) / 3:.3f}; the machine "
              f"{MachineCpu.cores_busy(m0, MachineCpu.snapshot()):.2f} cores busy (other jobs included)",
              flush=True)
        start = 0
        by_label = {v.label: v for v in variants}
        for run, label in rounds(list(by_label), args.runs):
            v = by_label[label]
            trials.add(label, run, await run_row(v, hostings[v.hosting], run, args, tree, start))
            start += 10_000_000  # fresh texts for every row
    finally:
        await stop_hostings(hostings)
    return variants, trials


def report(engine_set: str, variants: list[Variant], t: Trials, args: argparse.Namespace) -> None:
    print(f"\n### engines: {engine_set} ({args.runs} interleaved rounds; median [range])\n")
    print("| variant | items/s | p50 ms | p99 ms | CPU ms/item: ingress | replicas | Ray, Serve | "
          "callers | all processes | machine cores busy | refused (retried) per row | other non-OK |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for v in variants:
        s = {k: t.spread(v.label, k) for k in ("items_s", "p50", "p99", "ingress_ms", "replicas_ms",
                                                 "ray_ms", "callers_ms", "total_ms", "machine_cores",
                                                 "refused", "retried_other")}
        ray_cols = ("- | -" if v.hosting == "local" else  # Ray's idle processes do none of its work
                    f"{s['replicas_ms'].median:.3f} | {s['ray_ms'].median:.3f}")
        print(f"| {v.label} | {s['items_s'].fmt(0)} | {s['p50'].median:.1f} | {s['p99'].median:.1f} | "
              f"{s['ingress_ms'].median:.3f} | {ray_cols} | "
              f"{s['callers_ms'].median:.3f} | {s['total_ms'].fmt(3)} | {s['machine_cores'].median:.2f} | "
              f"{s['refused'].fmt(0)} | {s['retried_other'].fmt(0)} |")
    local_on, local_off = "in process, micro-batching on", "in process, micro-batching off"
    ray_on, ray_off = "Ray engines layout, micro-batching on", "Ray engines layout, micro-batching off"
    print()
    pairs = [(local_on, local_off, "in process: with / without micro-batching"),
             (ray_on, ray_off, "Ray, engines layout: with / without micro-batching")]
    pairs += [(v.label, local_on, f"{v.label} / in process, both with micro-batching")
              for v in variants if v.hosting != "local" and v.mode == "on"]
    cores = os.cpu_count() or 1
    for a, b, what in pairs:
        if a in t.rows and b in t.rows:
            r = t.ratio(a, b, "items_s")
            cpu = t.ratio(a, b, "total_ms")
            print(f"{what}: items/s x{r.fmt(2)}; all processes' CPU per item x{cpu.fmt(2)} "
                  f"({r.n} rounds)", flush=True)
            if b == local_on and a != local_on:
                # the most the machine's cores carry at a's CPU per item, over b's measured rate
                ceiling = [cores * 1000 / ra["total_ms"] / rb["items_s"]
                           for k, ra in t.rows[a].items() for k2, rb in t.rows[b].items() if k == k2]
                print(f"  ceiling: {cores} cores at {a}'s CPU per item (all processes) carry at most "
                      f"x{Spread.of(ceiling).fmt(2)} of in process's items/s", flush=True)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", nargs="+", choices=("fake", "real"), default=["fake", "real"])
    ap.add_argument("--runs", type=int, default=5, help="interleaved rounds (each variant once a round)")
    ap.add_argument("--callers", type=int, default=256, help="concurrent 1-item callers (N), fake engines")
    ap.add_argument("--calls", type=int, default=32, help="calls per caller in a round, with micro-batching")
    ap.add_argument("--off-calls", type=int, default=8, help="calls per caller in a round, without it "
                    "(the slow rows: a round of 256 x 8 takes a few seconds)")
    ap.add_argument("--min-s", type=float, default=4.0, help="each row repeats rounds of fresh items "
                    "until this many seconds have passed")
    ap.add_argument("--real-callers", type=int, default=32, help="callers with the real engines")
    ap.add_argument("--real-calls", type=int, default=1, help="calls per caller in a round, real engines")
    ap.add_argument("--real-min-s", type=float, default=6.0, help="seconds per row, real engines")
    ap.add_argument("--window-ms", type=float, default=1000 * CoalesceSettings.window_s)
    ap.add_argument("--max-items", type=int, default=CoalesceSettings.max_items)
    ap.add_argument("--no-ray", action="store_true", help="skip the Ray Serve hosting")
    ap.add_argument("--no-local", action="store_true", help="skip the in-process hosting")
    ap.add_argument("--actor", action="store_true", help="add serving.ray.transport=actor (Ray actor calls)")
    ap.add_argument("--service", action="store_true", help="add serving.ray.layout=service (one hop per call)")
    ap.add_argument("--serve-thread", action="store_true", help="with --service, also the service "
                    "layout with the replica's service in Serve's user-code thread")
    ap.add_argument("--proto", action="append", default=[], choices=sorted(PROTOTYPES),
                    help="add a prototype of the default layout's hop (repeatable): " + "; ".join(
                        f"{k}: {v[0]}" for k, v in PROTOTYPES.items()))
    ap.add_argument("--real-extras", action="store_true", help="run --actor, --service and --proto "
                    "on the real engines too (default: on the fake ones only, where the hop is visible)")
    ap.add_argument("--modes", nargs="+", choices=("off", "on"), default=["off", "on"],
                    help="micro-batching rows of the in-process and default Ray hostings")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="a server config override for every hosting (repeatable)")
    ap.add_argument("--gc-default", action="store_true",
                    help="leave Python's GC as it is (default: tuned as `reward-server serve` tunes it)")
    ap.add_argument("--client", help=argparse.SUPPRESS)  # the callers' process: the server's target
    ap.add_argument("--mode", choices=("on", "off"), help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client:
        await callers_main(args)
        return
    print(f"bench/microbatch.py: {machine_line()}; window {args.window_ms:g} ms, max "
          f"{args.max_items} items per merged call", flush=True)
    results = [(e, *await phase(e, args)) for e in args.engines]
    for engine_set, variants, trials in results:
        report(engine_set, variants, trials, args)
    print(f"\n{machine_line()}")


if __name__ == "__main__":
    asyncio.run(main())
