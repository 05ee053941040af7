"""What one engine call costs the process that makes it (the ingress), by hosting, in one run:
the fake judge's ``p_yes`` called in this process, through a Ray Serve deployment (the default
layout's hop: ``serving.ray.transport=grpc``, and ``actor`` with ``--actor``), and through a bare
``grpc.aio`` call to a server in its own process (the floor of any Python gRPC hop).

    python bench/hop_cost.py                 # 1, 100 and 400 prompts per call, 400 calls each, 5 runs
    python bench/hop_cost.py --items 1 64 256 --calls 1000 --actor --no-plain

For each hosting and call size it prints this process's CPU per call (all its threads, from
/proc: the event loop, gRPC's and Ray's threads), the main thread's share, and the wall time per
call, one call at a time. It then fits ``CPU per call = fixed + per item x items`` per hosting
and prints the fixed part over the bare gRPC call's. The callee's CPU (the replica, the plain
actor, or the bare server) is read from /proc too.

Beside Serve's deployment call it measures the alternatives a Ray user has for the same hop
(issue 56): a plain Ray actor call (``actor.p_yes.remote``, no Serve: no router, no autoscaling
metrics, no replica wrapper) and a call to an ObjectRef streaming generator of the same actor
(``num_returns="streaming"``, one result yielded); ``--no-plain`` skips them. Every hosting runs
``--runs`` times, interleaved (the order rotating each run); each figure is the median and range
over the runs, and so is the fitted fixed cost over the bare call's.

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

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback Ray, as `serve` sets it

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stats import Spread, Trials, machine_line, rounds  # noqa: E402
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


def plain_actor() -> tuple[Any, int]:
    """A plain Ray actor (no Serve) holding the fake judge, on the local Ray the apps started:
    (its handle, its pid)."""
    import ray

    @ray.remote(num_cpus=0)
    class PlainJudge:
        def __init__(self) -> None:
            self.judge = build_judge(FakeJudgeSettings())

        def pid(self) -> int:
            return os.getpid()

        async def p_yes(self, prompts: list[JudgePrompt]) -> list[float]:
            return await self.judge.p_yes(prompts)

        async def stream(self, prompts: list[JudgePrompt]) -> Any:
            yield await self.judge.p_yes(prompts)

    actor = PlainJudge.remote()  # type: ignore[attr-defined]
    return actor, int(ray.get(actor.pid.remote()))


def plain_deployment() -> tuple[Any, list[int]]:
    """A minimal Serve deployment of the fake judge (no ``@serve.batch``, no metrics of ours, no
    engine bookkeeping) and a handle to it as the ingress makes them (router on this loop, gRPC
    transport): what Serve's own call path costs without our replica code. (handle, pids)"""
    from ray import serve
    from ray.serve.handle import DeploymentHandle

    @serve.deployment(name="PlainJudge", max_ongoing_requests=256, ray_actor_options={"num_cpus": 0})
    class PlainServeJudge:
        def __init__(self) -> None:
            self.judge = build_judge(FakeJudgeSettings())

        async def p_yes(self, prompts: list[JudgePrompt]) -> list[float]:
            return await self.judge.p_yes(prompts)

    serve.run(PlainServeJudge.bind(), name="hopplain", route_prefix=None)  # type: ignore[attr-defined]
    own: DeploymentHandle[Any] = DeploymentHandle("PlainJudge", "hopplain")
    own._init(_run_router_in_separate_loop=False)
    return own.options(_by_reference=False), replica_pids("hopplain")


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
    ap.add_argument("--no-plain", action="store_true", help="skip the plain Ray actor and streaming rows")
    ap.add_argument("--runs", type=int, default=5, help="interleaved runs of every hosting")
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
        if not args.no_plain:
            actor, actor_pid = plain_actor()

            async def plain(items: Sequence[JudgePrompt]) -> list[float]:
                out: list[float] = await actor.p_yes.remote(list(items))
                return out

            async def streamed(items: Sequence[JudgePrompt]) -> list[float]:
                out: list[float] = []
                async for ref in actor.stream.options(num_returns="streaming").remote(list(items)):
                    out.extend(await ref)
                return out

            hot = apps[0].hosting.engines.ray_judge.caller._hot_handle()

            async def handle_only(items: Sequence[JudgePrompt]) -> list[float]:
                out: list[float] = await hot.p_yes.remote(list(items))
                return out

            minimal, minimal_pids = plain_deployment()

            async def serve_minimal(items: Sequence[JudgePrompt]) -> list[float]:
                out: list[float] = await minimal.p_yes.remote(list(items))
                return out

            hostings["the same deployment, Serve's handle alone (no adapter of ours)"] = (
                handle_only, hostings["Ray Serve deployment, transport grpc"][1])
            hostings["minimal Serve deployment (no @serve.batch), Serve's handle alone"] = (
                serve_minimal, minimal_pids)
            hostings["plain Ray actor call (no Serve)"] = (plain, [actor_pid])
            hostings["Ray streaming generator call (no Serve)"] = (streamed, [actor_pid])
        tune_gc_for_serving()  # as `reward-server serve` tunes the ingress
        trials = Trials()
        for run, name in rounds(list(hostings), args.runs):
            call, others = hostings[name]
            for n in args.items:
                cpu, main_cpu, other, wall = await measure(call, prompts(n), args.calls, others)
                trials.add(f"{name}|{n}", run, {"cpu": cpu, "main": main_cpu, "other": other, "wall": wall})
            print(f"  run {run + 1}: {name} done", file=sys.stderr, flush=True)
        await channel.close()
    finally:
        for app in reversed(apps):  # the first one started Ray and stops it
            await app.stop(grace=1.0, drain_delay=0)
        if proc is not None:
            proc.terminate()
            proc.wait()
    print(f"\n{args.runs} interleaved runs of {args.calls} calls per row; median [range] over the runs\n")
    print("| hosting | prompts per call | caller CPU ms/call (all threads) | its main thread | callee CPU "
          "ms/call | both sides | wall ms/call |\n|---|---:|---:|---:|---:|---:|---:|")
    for name in hostings:
        for n in args.items:
            key = f"{name}|{n}"
            for r in trials.rows[key].values():
                r["both"] = r["cpu"] + r["other"]
            sp = {k: trials.spread(key, k) for k in ("cpu", "main", "other", "both", "wall")}
            print(f"| {name} | {n} | {sp['cpu'].fmt(3)} | {sp['main'].median:.3f} | {sp['other'].fmt(3)} | "
                  f"{sp['both'].fmt(3)} | {sp['wall'].median:.3f} |")
    print("\nCPU per call = fixed + per prompt x prompts (least squares over the sizes, per run; median [range]):")
    bare = "bare grpc.aio hop (floor)"
    for name in hostings:
        fixed, per, callee, vs = [], [], [], []
        for run in range(args.runs):
            a, b = fit([(n, trials.rows[f"{name}|{n}"][run]["cpu"]) for n in args.items])
            fb = fit([(n, trials.rows[f"{bare}|{n}"][run]["cpu"]) for n in args.items])[0]
            fixed.append(a)
            per.append(b)
            callee.append(fit([(n, trials.rows[f"{name}|{n}"][run]["other"]) for n in args.items])[0])
            if fb > 0:
                vs.append(a / fb)
        print(f"  {name}: caller fixed {Spread.of(fixed).fmt(3)} ms, per prompt {Spread.of(per).fmt(2)} us; "
              f"callee fixed {Spread.of(callee).fmt(3)} ms; caller's fixed / bare gRPC's x{Spread.of(vs).fmt(2)}")
    print(machine_line())

if __name__ == "__main__":
    asyncio.run(main())
