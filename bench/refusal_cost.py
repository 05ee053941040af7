"""What one refused call costs the server: its CPU per Score call refused for load
(RESOURCE_EXHAUSTED before the request is read), against an Info call (answered, no engine work)
and a served 1-item Score call, and against gRPC's own floor (a bare ``grpc.aio`` server whose
handler answers at once or aborts at once), in one run.

    python bench/refusal_cost.py              # 2,000 calls of each kind, one at a time and 16 at once
    python bench/refusal_cost.py --calls 8000

`reward-server serve --fake` runs in its own process with admission fixed at one call in flight
and no line (`service.admission.max_calls_in_flight=1`, `max_waiting=0`) and fake engines that sleep
``--hold-s``. One Score call holds that slot while the refused calls run; the Info and served
rows run before it. The server's CPU per call comes from /proc (all its threads: gRPC's own
threads as well as the event loop). The callers send one call at a time, so the latency is the
round trip of one call on an otherwise idle server; the rows "16 at once" keep 16 calls in
flight (only the refused row: admission has one slot, which Info calls take too). The
bare server (this script with ``--bare-port``, its own process, no interceptors) answers raw bytes
with an empty message, or aborts with RESOURCE_EXHAUSTED. The burst rows send ``--burst`` calls at
once, ``--bursts`` times, and report each burst's slowest round trip. The large-burst rows (the bar of
issue 51) send ``--big-burst`` Score calls of ``--big-items`` NLI items (25 KB each with the
defaults: 512 x 256) at once on one channel, to ours and to the bare server in turn,
``--big-bursts`` times each, and report the median refusal latency (p50 over a burst's calls,
median over the bursts) and the ratio of each round's pair (median and range). The bare figure is what any call costs a
grpc.aio server on this machine before our code runs, so a burst of N calls arriving at once
takes at least N times it of the server's CPU to answer, whatever it answers (printed).
Loopback only; stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import free_port, proc_cpu_s  # noqa: E402

from reward_server._proto.reward.v1 import reward_pb2 as pb  # noqa: E402
from reward_server._proto.reward.v1 import reward_pb2_grpc as pb_grpc  # noqa: E402

TOKEN = "bench-token-refusal-cost-0123456789"
ITEM = pb.ScoreItem(id="a", nli_constraints=pb.NliConstraints(
    response="Paris is big.", answer="Paris", preference="big"))


Row = tuple[str, float, float, dict[str, int]]


async def counted(call: Callable[[], Awaitable[object]], codes: dict[str, int]) -> float:
    """One call: its status code tallied in ``codes``; its round trip in seconds."""
    t = time.perf_counter()
    try:
        await call()
        codes["OK"] = codes.get("OK", 0) + 1
    except grpc.aio.AioRpcError as e:
        codes[e.code().name] = codes.get(e.code().name, 0) + 1
    return time.perf_counter() - t


async def row(name: str, pid: int, n: int, call: Callable[[], Awaitable[object]],
              concurrency: int = 1) -> Row:
    codes: dict[str, int] = {}

    async def loop(k: int) -> None:
        for _ in range(k):
            await counted(call, codes)

    for _ in range(min(n, 100)):  # warm-up, not counted
        await asyncio.gather(*(loop(1) for _ in range(concurrency)))
    codes.clear()
    c0, t0 = proc_cpu_s(pid), time.perf_counter()
    await asyncio.gather(*(loop(n // concurrency) for _ in range(concurrency)))
    n = concurrency * (n // concurrency)
    wall, cpu = time.perf_counter() - t0, proc_cpu_s(pid) - c0
    label = name + ("" if concurrency == 1 else f", {concurrency} at once")
    return label, 1000 * cpu / n, 1000 * wall / n * concurrency, codes


async def burst_row(name: str, pid: int, call: Callable[[], Awaitable[object]], *, size: int,
                    bursts: int) -> Row:
    """``bursts`` bursts of ``size`` calls sent at once (50 ms apart); the latency column is the
    median over the bursts of each burst's slowest call (the label gives that of its median)."""
    codes: dict[str, int] = {}
    slowest: list[float] = []
    middle: list[float] = []
    c0 = proc_cpu_s(pid)
    for _ in range(bursts):
        lat = sorted(await asyncio.gather(*(counted(call, codes) for _ in range(size))))
        slowest.append(lat[-1])
        middle.append(lat[len(lat) // 2])
        await asyncio.sleep(0.05)
    cpu = proc_cpu_s(pid) - c0
    slowest.sort()
    middle.sort()
    label = (f"{name}, bursts of {size} at once (latency: a burst's slowest call; its median "
             f"call {1000 * middle[len(middle) // 2]:.1f} ms)")
    return label, 1000 * cpu / (size * bursts), 1000 * slowest[len(slowest) // 2], codes


async def burst_p50(call: Callable[[], Awaitable[object]], size: int,
                    codes: dict[str, int]) -> float:
    """One burst of ``size`` calls sent at once: the median call's round trip."""
    lat = sorted(await asyncio.gather(*(counted(call, codes) for _ in range(size))))
    return lat[len(lat) // 2]


async def big_bursts(ours: tuple[int, Callable[[], Awaitable[object]]],
                     bare: tuple[int, Callable[[], Awaitable[object]]], *, size: int,
                     bursts: int) -> tuple[list[Row], list[float]]:
    """Bursts of ``size`` calls at once on one channel, to our server and to the bare one in
    turn (each round alternates which goes first, 50 ms apart): a row each (latency: the
    median over the bursts of a burst's p50, server CPU per call) and the paired ratios."""
    p50 = {"ours": [], "bare": []}  # type: dict[str, list[float]]
    cpu = {"ours": 0.0, "bare": 0.0}
    codes: dict[str, dict[str, int]] = {"ours": {}, "bare": {}}
    sides = {"ours": ours, "bare": bare}
    for k in range(bursts):
        for name in (("ours", "bare") if k % 2 == 0 else ("bare", "ours")):
            pid, call = sides[name]
            c0 = proc_cpu_s(pid)
            p50[name].append(await burst_p50(call, size, codes[name]))
            cpu[name] += proc_cpu_s(pid) - c0
            await asyncio.sleep(0.05)
    ratios = sorted(a / b for a, b in zip(p50["ours"], p50["bare"], strict=True))
    rows = []
    for name, label in (("ours", "Score, refused for load"), ("bare", "bare grpc.aio: aborted at once")):
        xs = sorted(p50[name])
        rows.append((f"{label}, bursts of {size} calls of 25 KB at once on one channel, "
                     f"interleaved (latency: a burst's p50, median over {bursts}; range "
                     f"{1000 * xs[0]:.0f}-{1000 * xs[-1]:.0f} ms)",
                     1000 * cpu[name] / (size * bursts), 1000 * xs[len(xs) // 2], codes[name]))
    return rows, ratios


def big_request(items: int) -> pb.ScoreRequest:
    return pb.ScoreRequest(items=[pb.ScoreItem(id=f"i{k}", nli_constraints=pb.NliConstraints(
        response="Paris is the capital of France, a big city with many old museums.", answer="Paris",
        preference="big")) for k in range(items)])


async def bare_server(port: int) -> None:
    """A grpc.aio server with nothing of ours: /bare.B/Answer returns an empty message at once,
    /bare.B/Refuse aborts with RESOURCE_EXHAUSTED at once (raw bytes, no parsing)."""

    async def answer(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return b""

    async def refuse(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy")
        raise AssertionError("unreachable: abort raises")

    server = grpc.aio.server()
    handlers = {"Answer": grpc.unary_unary_rpc_method_handler(answer),
                "Refuse": grpc.unary_unary_rpc_method_handler(refuse)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bare.B", handlers),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def start_bare() -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    return subprocess.Popen([sys.executable, __file__, "--bare-port", str(port)], cwd=REPO), port


async def bare_rows(args: argparse.Namespace) -> list[Row]:
    proc, port = start_bare()
    rows = []
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await channel.channel_ready()
            answer = channel.unary_unary("/bare.B/Answer")
            refuse = channel.unary_unary("/bare.B/Refuse")
            for concurrency in (1, args.concurrency):
                rows.append(await row("bare grpc.aio: answered at once", proc.pid, args.calls,
                                      lambda: answer(b"", timeout=5), concurrency))
                rows.append(await row("bare grpc.aio: aborted at once", proc.pid, args.calls,
                                      lambda: refuse(b"", timeout=5), concurrency))
            rows.append(await burst_row("bare grpc.aio: aborted at once", proc.pid,
                                        lambda: refuse(b"", timeout=5), size=args.burst,
                                        bursts=args.bursts))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return rows


async def main(args: argparse.Namespace) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARD_SERVER")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    engines = (f"engines={{judge: {{kind: fake}}, nli: {{kind: fake, latency_s: {args.hold_s}}}}}")
    cmd = [sys.executable, "-m", "reward_server", "serve", "--port", str(port), "--set", engines,
           "--set", f"server.auth_token={TOKEN}", "--set", "service.admission.max_waiting=0",
           "--set", "service.admission.max_calls_in_flight=1", "--set", "server.drain_delay_s=0",
           *(x for kv in args.set for x in ("--set", kv))]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    md = (("authorization", f"Bearer {TOKEN}"),)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        stub = pb_grpc.RewardServiceStub(channel)
        deadline = time.monotonic() + 120
        while True:
            try:
                await stub.Info(pb.InfoRequest(), metadata=md, timeout=1)
                break
            except grpc.aio.AioRpcError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("the server did not start") from None
                await asyncio.sleep(0.2)
        judge_item = pb.ScoreItem(id="j", rubric_score=pb.RubricScore(
            text="The product is great and the price is fair.", rules=["mentions the price"]))
        info = lambda: stub.Info(pb.InfoRequest(), metadata=md, timeout=5)  # noqa: E731
        rows = [await row("Info (answered)", proc.pid, args.calls, info)]
        served = pb.ScoreRequest(items=[judge_item])  # the judge does not sleep
        rows.append(await row("Score, 1 judge item (served)", proc.pid, args.calls,
                              lambda: stub.Score(served, metadata=md, timeout=5)))
        held = pb.ScoreRequest(items=[ITEM])  # the NLI engine sleeps: holds the one slot
        hold = asyncio.ensure_future(stub.Score(held, metadata=md, timeout=args.hold_s + 30))
        await asyncio.sleep(0.5)
        refused = lambda: stub.Score(held, metadata=md, timeout=5)  # noqa: E731
        rows.append(await row("Score, refused for load", proc.pid, args.calls, refused))
        rows.append(await row("Score, refused for load", proc.pid, args.calls, refused,
                              args.concurrency))
        rows.append(await burst_row("Score, refused for load", proc.pid, refused,
                                    size=args.burst, bursts=args.bursts))
        # pre-encoded for both servers: the client's encoding is not timed
        big = big_request(args.big_items).SerializeToString()
        raw_score = channel.unary_unary("/reward.v1.RewardService/Score")
        bare_proc, bare_port = start_bare()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{bare_port}") as bare_channel:
                await bare_channel.channel_ready()
                bare_refuse = bare_channel.unary_unary("/bare.B/Refuse")
                big_rows, ratios = await big_bursts(
                    (proc.pid, lambda: raw_score(big, metadata=md, timeout=30)),
                    (bare_proc.pid, lambda: bare_refuse(big, timeout=30)),
                    size=args.big_burst, bursts=args.big_bursts)
        finally:
            bare_proc.terminate()
            bare_proc.wait(timeout=30)
        hold.cancel()
    finally:
        await channel.close()
        proc.terminate()
        proc.wait(timeout=30)
    bare = await bare_rows(args)
    print(f"\n{args.calls} calls of each kind; server CPU from /proc (all threads); latency: "
          "each call's round trip\n")
    print("| call | server CPU ms/call | latency ms/call | codes |")
    print("|---|---:|---:|---|")
    for name, cpu, lat, codes in rows + bare + big_rows:
        print(f"| {name} | {cpu:.3f} | {lat:.3f} | {codes} |")
    info = rows[0][1]
    print(f"\nrefused / Info: x{rows[2][1] / info:.2f} server CPU; served 1-item Score / Info: "
          f"x{rows[1][1] / info:.2f}")
    print(f"ours / bare grpc.aio, server CPU per call: refused one at a time x"
          f"{rows[2][1] / bare[1][1]:.2f}, {args.concurrency} at once x{rows[3][1] / bare[3][1]:.2f}; "
          f"Info (answered) one at a time x{rows[0][1] / bare[0][1]:.2f}")
    print(f"bursts of {args.burst} refused at once, the slowest call of a burst (median over "
          f"{args.bursts}): ours {rows[4][2]:.1f} ms, bare grpc.aio {bare[-1][2]:.1f} ms")
    print(f"bursts of {args.big_burst} calls of {args.big_items} items ({len(big):,} bytes) refused "
          f"at once on one channel, interleaved, refusal p50 (median over {args.big_bursts} "
          f"bursts): ours {big_rows[0][2]:.1f} ms, bare grpc.aio {big_rows[1][2]:.1f} ms: ratio "
          f"x{ratios[len(ratios) // 2]:.2f} (median of the paired bursts; range "
          f"{ratios[0]:.2f}-{ratios[-1]:.2f}; bar: <= 1.5)")
    floor = min(bare[2][1], bare[3][1])
    print(f"a burst of N calls at once costs a grpc.aio server at least N x {floor:.3f} ms of "
          f"CPU to answer, whatever it answers: N=8 {8 * floor:.1f} ms, N=32 {32 * floor:.1f} ms "
          "(bench/faults.py's 2x and 8x overload onsets)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls of each kind")
    ap.add_argument("--concurrency", type=int, default=16,
                    help="calls in flight in the rows 'at once'")
    ap.add_argument("--burst", type=int, default=32,
                    help="calls of one burst (32: bench/faults.py's 8x overload loops)")
    ap.add_argument("--bursts", type=int, default=40, help="bursts per burst row")
    ap.add_argument("--big-bursts", type=int, default=15,
                    help="bursts of each server in the interleaved large-burst rows")
    ap.add_argument("--big-burst", type=int, default=512,
                    help="calls of one large burst (issue 51's bar: 512)")
    ap.add_argument("--big-items", type=int, default=256,
                    help="NLI items per call of the large bursts (256: ~25 KB)")
    ap.add_argument("--hold-s", type=float, default=120.0,
                    help="how long the call holding the slot sleeps (longer than the refused rows)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="more `reward-server serve --set` overrides for our server")
    ap.add_argument("--bare-port", type=int, help=argparse.SUPPRESS)  # the bare server's process
    parsed = ap.parse_args()
    asyncio.run(bare_server(parsed.bare_port) if parsed.bare_port else main(parsed))
