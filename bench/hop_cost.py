"""What one engine call costs the process that makes it (the ingress), by hosting, in one run:
the fake judge's ``p_yes`` called in this process, through a Ray Serve deployment (the default
layout's hop: ``serving.ray.transport=grpc``, and ``actor`` with ``--actor``), and through a bare
``grpc.aio`` call to a server in its own process (the floor of any Python gRPC hop).

    python bench/hop_cost.py                 # 1, 100 and 400 prompts per call, 400 calls each
    python bench/hop_cost.py --items 1 64 256 --calls 1000 --actor

For each hosting and call size it prints this process's CPU per call (all its threads, from
/proc: the event loop, gRPC's and Ray's threads), the main thread's share, and the wall time per
call, one call at a time. It then fits ``CPU per call = fixed + per item x items`` per hosting
and prints the fixed part over the bare gRPC call's. The deployment's replicas run elsewhere:
their CPU is not counted, as in ``bench/microbatch.py``'s server column.

Why it matters (docs/performance.md, "What a deployment call costs the ingress"): in the default
layout the ingress runs the whole service and makes one deployment call per engine batch, so
verl's pattern through Ray can reach at best S / (S + H) of in-process throughput, where S is
the ingress's CPU per item in process and H the hops' CPU per item. Loopback only; a local Ray
(num_cpus=2) it starts and stops itself.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import free_port  # noqa: E402

from reward_server.app import start_app, tune_gc_for_serving  # noqa: E402
from reward_server.backends.base import JudgePrompt  # noqa: E402
from reward_server.backends.factory import build_judge  # noqa: E402
from reward_server.backends.settings import FakeJudgeSettings  # noqa: E402
from reward_server.config import load_config  # noqa: E402

FAKE = "engines={judge: {kind: fake}, nli: {kind: fake}}"
Call = Callable[[Sequence[JudgePrompt]], Awaitable[Any]]


def prompts(n: int) -> list[JudgePrompt]:
    """``n`` judge prompts shaped like the rubric reward's (the system message shared)."""
    system = "You are a strict judge. Answer Yes or No."
    return [JudgePrompt(system=system, prefix=f"<Text>Morning coffee number {i}.</Text>\n",
                        suffix=f'<Rule>Mentions "coffee" ({i % 7}).</Rule>') for i in range(n)]


def replica_pids(app: str) -> list[int]:
    """The pids of ``app``'s Serve replicas on this machine (by their process title)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                title = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if title.startswith(f"ray::ServeReplica:{app}:"):
                out.append(int(entry.name))
    return out


def _ticks(path: str) -> int:
    f = Path(path).read_text().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])


async def measure(call: Call, items: list[JudgePrompt], calls: int,
                  others: Sequence[int]) -> tuple[float, float, float, float]:
    """``calls`` calls of ``call(items)`` one at a time (after 20 unmeasured): this process's
    CPU ms per call, the main thread's, the processes ``others``' (the replicas), wall ms."""
    for _ in range(20):
        await call(items)
    hz, pid = os.sysconf("SC_CLK_TCK"), os.getpid()
    main0, cpu0, t0 = _ticks(f"/proc/{pid}/task/{pid}/stat"), time.process_time(), time.perf_counter()
    other0 = sum(_ticks(f"/proc/{p}/stat") for p in others)
    for _ in range(calls):
        await call(items)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    main = (_ticks(f"/proc/{pid}/task/{pid}/stat") - main0) / hz
    other = (sum(_ticks(f"/proc/{p}/stat") for p in others) - other0) / hz
    return 1000 * cpu / calls, 1000 * main / calls, 1000 * other / calls, 1000 * wall / calls


async def bare_server(port: int) -> None:
    """/bare.B/PYes: unpickles a list of prompts and answers a pickled list of floats."""

    async def p_yes(request: bytes, context: Any) -> bytes:
        return pickle.dumps([0.5] * len(pickle.loads(request)))

    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
    handler = grpc.unary_unary_rpc_method_handler(p_yes)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bare.B", {"PYes": handler}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def fit(rows: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``cpu = a + b x items`` over (items, cpu ms): (a ms, b us)."""
    n = len(rows)
    mx = sum(x for x, _ in rows) / n
    my = sum(y for _, y in rows) / n
    sxx = sum((x - mx) ** 2 for x, _ in rows)
    b = sum((x - mx) * (y - my) for x, y in rows) / sxx if sxx else 0.0
    return my - b * mx, 1000 * b


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, nargs="+", default=[1, 100, 400], help="prompts per call")
    ap.add_argument("--calls", type=int, default=400, help="measured calls per row")
    ap.add_argument("--actor", action="store_true", help="also serving.ray.transport=actor")
    ap.add_argument("--bare-port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.bare_port:
        await bare_server(args.bare_port)
        return
    hostings: dict[str, tuple[Call, list[int]]] = {}
    local = build_judge(FakeJudgeSettings())
    hostings["in process (fake judge)"] = (local.p_yes, [])
    apps = []
    proc = None
    try:
        for transport in ("grpc", "actor") if args.actor else ("grpc",):
            app = await start_app(load_config(overrides=[
                "server.port=0", "server.drain_delay_s=0", FAKE, "serving.mode=ray",
                f"serving.ray.app_prefix=hop{transport}", "serving.ray.local_num_cpus=2",
                "serving.ray.judge.num_cpus=0", "serving.ray.nli.num_cpus=0",
                f"serving.ray.transport={transport}"], env={}))
            apps.append(app)
            hostings[f"Ray Serve deployment, transport {transport}"] = (
                app.hosting.engines.ray_judge.p_yes, replica_pids(f"hop{transport}-judge"))
        # opened after Ray is up: in one run with this channel opened first, Ray's start timed out
        port = free_port()
        proc = subprocess.Popen([sys.executable, __file__, "--bare-port", str(port)], cwd=REPO)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[
            ("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)])
        await asyncio.wait_for(channel.channel_ready(), 30)
        raw = channel.unary_unary("/bare.B/PYes")

        async def bare(items: Sequence[JudgePrompt]) -> list[float]:
            out: list[float] = pickle.loads(await raw(pickle.dumps(list(items))))
            return out

        hostings["bare grpc.aio hop (floor)"] = (bare, [proc.pid])
        tune_gc_for_serving()  # as `reward-server serve` tunes the ingress
        results: dict[str, list[tuple[int, float]]] = {}
        print("\n| hosting | prompts per call | caller CPU ms/call (all threads) | its main "
              "thread | callee CPU ms/call (replica or bare server) | wall ms/call |\n"
              "|---|---:|---:|---:|---:|---:|", flush=True)
        for name, (call, others) in hostings.items():
            for n in args.items:
                cpu, main_cpu, other, wall = await measure(call, prompts(n), args.calls, others)
                results.setdefault(name, []).append((n, cpu))
                print(f"| {name} | {n} | {cpu:.3f} | {main_cpu:.3f} | {other:.3f} | {wall:.3f} |",
                      flush=True)
        await channel.close()
    finally:
        for app in reversed(apps):  # the first one started Ray and stops it
            await app.stop(grace=1.0, drain_delay=0)
        if proc is not None:
            proc.terminate()
            proc.wait()
    floor = fit(results["bare grpc.aio hop (floor)"])[0]
    print("\nCPU per call = fixed + per item x prompts (least squares over the sizes):")
    for name, rows in results.items():
        a, b = fit(rows)
        vs = f"  fixed / bare gRPC's x{a / floor:.1f}" if "Ray" in name and floor > 0 else ""
        print(f"  {name}: fixed {a:.3f} ms, per prompt {b:.2f} us{vs}")


if __name__ == "__main__":
    asyncio.run(main())
