"""A hosting not built yet, measured: ONE Ray hop per Score call, against the in-process server,
on verl's micro-batched pattern (bench/microbatch.py's callers), in one run.

    python bench/one_hop.py                  # rows of >= 8 s each
    python bench/one_hop.py --min-s 15

Today's Ray hosting (bench/microbatch.py's "gRPC -> Ray Serve" row) parses and orders the call in
the gRPC ingress and sends the judge's and the NLI's batches to their own deployments: two hops
per merged call, the per-item work in the ingress. The prototype here instead runs the whole
service in one Serve replica (fake engines in that process, :meth:`RewardServicer.call`, the
same code path the HTTP door uses) and a thin ``grpc.aio`` ingress (raw bytes in, raw bytes out,
no parsing, no admission of its own) that sends each Score call's body to it over Serve's gRPC
path (``_by_reference=False``, a router on the ingress's loop, as ``serving/_private/adapters.py``
does). Rows:

1. in process: ``start_app`` with fake engines in this process (the microbatch bench's row);
2. one hop, Serve's default: the replica runs the service in Serve's user-code thread;
3. one hop, the service on the replica's own event loop
   (``RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0`` in that replica's environment);
4. in process again, after Ray has stopped.

The callers run in a child process (bench/microbatch.py ``--client``, its ``callers_row``): 256
callers x 32 one-item calls a round, merged by ``AsyncRewardClient``'s micro-batching (2 ms, 64
items), rounds until ``--min-s``. A local Ray with ``num_cpus=2``; loopback only; stops by
itself. Prints items/s, p50/p99 and the ratios of each one-hop row to the mean of the two
in-process rows.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import free_port
from microbatch import callers_row

from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server.app import build_service, start_app, tune_gc_for_serving
from reward_server.config import load_config
from reward_server.rpc.servicer import RewardServicer
from reward_server.serving import start_engines

FAKE = "engines={judge: {kind: fake}, nli: {kind: fake}}"
APPS = {"thread": "onehop-thread", "loop": "onehop-loop"}
WARM = pb.ScoreRequest(items=[pb.ScoreItem(id="w", nli_constraints=pb.NliConstraints(
    response="Paris is big.", answer="Paris", preference="big"))]).SerializeToString()


async def in_process(args: argparse.Namespace) -> dict[str, Any]:
    app = await start_app(load_config(
        overrides=["server.port=0", "server.drain_delay_s=0", FAKE], env={}))
    tune_gc_for_serving()
    try:
        return await callers_row(app.target, "on", args)
    finally:
        await app.stop(0)


class ServiceReplica:
    """The whole service in one replica: fake engines, the orchestration, the servicer's call."""

    def __init__(self) -> None:
        self._servicer: RewardServicer | None = None

    async def score_raw(self, raw: bytes) -> bytes:
        if self._servicer is None:  # on the loop that serves the calls
            config = load_config(overrides=["server.port=0", FAKE], env={})
            engines = start_engines(config.engines, config.serving)
            self._servicer = RewardServicer(build_service(config, engines), config.server)
            tune_gc_for_serving()

        async def receive() -> bytes:
            return raw

        response = await self._servicer.call("Score", receive, time_remaining=lambda: None,
                                             transport="ray")
        return response.SerializeToString()


def deploy() -> None:
    import ray
    from ray import serve

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    for variant, app in APPS.items():
        env = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"} if variant == "loop" else {}
        deployment = serve.deployment(
            ServiceReplica, name="service", num_replicas=1, max_ongoing_requests=64,
            ray_actor_options={"num_cpus": 0, "runtime_env": {"env_vars": env}})
        serve.run(deployment.bind(), name=app, route_prefix=None)


async def one_hop(app: str, args: argparse.Namespace) -> dict[str, Any]:
    from ray.serve.handle import DeploymentHandle

    handle: DeploymentHandle[Any] = DeploymentHandle("service", app)
    handle._init(_run_router_in_separate_loop=False)
    hot = handle.options(_by_reference=False)
    await hot.score_raw.remote(WARM)

    async def score(raw: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        answer: bytes = await hot.score_raw.remote(raw)
        return answer

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "reward.v1.RewardService", {"Score": grpc.unary_unary_rpc_method_handler(score)}),))
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    tune_gc_for_serving()
    try:
        return await callers_row(f"127.0.0.1:{port}", "on", args)
    finally:
        await server.stop(0)
        await handle.shutdown_async()


def main(args: argparse.Namespace) -> None:
    rows: list[tuple[str, dict[str, Any]]] = [("in process", asyncio.run(in_process(args)))]
    deploy()
    rows.append(("one hop, Serve's user-code thread", asyncio.run(one_hop(APPS["thread"], args))))
    rows.append(("one hop, the replica's own loop", asyncio.run(one_hop(APPS["loop"], args))))
    import ray

    ray.shutdown()
    rows.append(("in process, after Ray", asyncio.run(in_process(args))))
    print(f"\n{args.callers} callers x {args.calls} one-item calls a round, micro-batching on, "
          f"rows of >= {args.min_s} s\n")
    print("| hosting | items/s | p50 ms | p99 ms | failed calls |")
    print("|---|---:|---:|---:|---:|")
    for name, r in rows:
        print(f"| {name} | {r['items_s']:,.0f} | {r['p50']:.1f} | {r['p99']:.1f} | {r['bad']} |")
    base = (rows[0][1]["items_s"] + rows[3][1]["items_s"]) / 2
    print(f"\none hop / in process (the mean of its two rows, {base:,.0f} items/s): "
          f"Serve's thread x{rows[1][1]['items_s'] / base:.2f}, "
          f"the replica's loop x{rows[2][1]['items_s'] / base:.2f} (issue target for Ray >= 0.8)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--callers", type=int, default=256)
    ap.add_argument("--calls", type=int, default=32, help="one-item calls per caller a round")
    ap.add_argument("--min-s", type=float, default=8.0, help="each row repeats rounds this long")
    ap.add_argument("--window-ms", type=float, default=2.0, help="micro-batching window")
    ap.add_argument("--max-items", type=int, default=64, help="items per merged call")
    main(ap.parse_args())
