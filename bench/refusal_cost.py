"""What one refused call costs the server: its CPU per Score call refused for load
(RESOURCE_EXHAUSTED before the request is read), against an Info call (answered, no engine work)
and a served 1-item Score call, in one run.

    python bench/refusal_cost.py              # 2,000 calls of each kind, one at a time
    python bench/refusal_cost.py --calls 8000

`reward-server serve --fake` runs in its own process with admission fixed at one call in flight
(`service.admission.adaptive=false`, `max_calls_in_flight=1`) and fake engines that sleep
``--hold-s``. One Score call holds that slot while the refused calls run; the Info and served
rows run before it. The server's CPU per call comes from /proc (all its threads: gRPC's own
threads as well as the event loop). The callers send one call at a time, so the latency is the
round trip of one call on an otherwise idle server. Loopback only; stops by itself.
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


async def row(name: str, pid: int, n: int,
              call: Callable[[], Awaitable[object]]) -> tuple[str, float, float, dict[str, int]]:
    codes: dict[str, int] = {}
    c0, t0 = proc_cpu_s(pid), time.perf_counter()
    for _ in range(n):
        try:
            await call()
            codes["OK"] = codes.get("OK", 0) + 1
        except grpc.aio.AioRpcError as e:
            codes[e.code().name] = codes.get(e.code().name, 0) + 1
    wall, cpu = time.perf_counter() - t0, proc_cpu_s(pid) - c0
    return name, 1000 * cpu / n, 1000 * wall / n, codes


async def main(args: argparse.Namespace) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARD_SERVER")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    engines = (f"engines={{judge: {{kind: fake}}, nli: {{kind: fake, latency_s: {args.hold_s}}}}}")
    cmd = [sys.executable, "-m", "reward_server", "serve", "--port", str(port), "--set", engines,
           "--set", f"server.auth_token={TOKEN}", "--set", "service.admission.adaptive=false",
           "--set", "service.admission.max_calls_in_flight=1", "--set", "server.drain_delay_s=0"]
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
        rows = [await row("Info (answered)", proc.pid, args.calls,
                          lambda: stub.Info(pb.InfoRequest(), metadata=md, timeout=5))]
        served = pb.ScoreRequest(items=[judge_item])  # the judge does not sleep
        rows.append(await row("Score, 1 judge item (served)", proc.pid, args.calls,
                              lambda: stub.Score(served, metadata=md, timeout=5)))
        held = pb.ScoreRequest(items=[ITEM])  # the NLI engine sleeps: holds the one slot
        hold = asyncio.ensure_future(stub.Score(held, metadata=md, timeout=args.hold_s + 30))
        await asyncio.sleep(0.5)
        rows.append(await row("Score, refused for load", proc.pid, args.calls,
                              lambda: stub.Score(held, metadata=md, timeout=5)))
        hold.cancel()
    finally:
        await channel.close()
        proc.terminate()
        proc.wait(timeout=30)
    print(f"\n{args.calls} calls of each kind, one at a time; server CPU from /proc (all threads)\n")
    print("| call | server CPU ms/call | latency ms/call | codes |")
    print("|---|---:|---:|---|")
    for name, cpu, lat, codes in rows:
        print(f"| {name} | {cpu:.3f} | {lat:.3f} | {codes} |")
    info = rows[0][1]
    print(f"\nrefused / Info: x{rows[2][1] / info:.2f} server CPU; served 1-item Score / Info: "
          f"x{rows[1][1] / info:.2f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls of each kind")
    ap.add_argument("--hold-s", type=float, default=120.0,
                    help="how long the call holding the slot sleeps (longer than the refused row)")
    asyncio.run(main(ap.parse_args()))
