"""Two Ray nodes on one machine, an ingress on each, a whole node lost under load.

The cluster: the session's Ray (``ray_session``) is the head; a second node joins it with
Ray's own ``ray start --address`` (:class:`trainer.ray_head.LocalRayWorker`: its own temp dir,
free ports, 1 CPU). The engine applications are deployed once, from this process, with two
replicas each (``min_replicas = max_replicas = 2``, 0.2 CPU each). Serve's SPREAD scheduling is
best effort (seen placing both replicas of an application on one node), so placement is
forced with resources: an idle actor fills the second node while the replicas start (all on
the head), then others fill the head (one queued for the room a killed replica frees) while
one replica of each application is killed, so Serve's replacement can only start on the
second node; each replica reports its node, and the
test checks one per node before it relies on it. Two ingresses (``python -m reward_server
serve``, ``serving.ray.deploy=false``) attach to the applications: one on the head, one on the
second node (``serving.ray.node_temp_dir`` picks that node's raylet). Clients spread their
calls over both with gRPC's round_robin.

What it proves on one machine: a node (raylet, its replicas and the ingress on it) killed
with SIGKILL mid-load loses and mixes up no item; calls in flight on the dead replicas and the
dead ingress come back UNAVAILABLE and the client's retry answers them through the survivor;
Serve rebuilds the replica count on the surviving node; the surviving ingress stays SERVING.
What it cannot: cross-host networking (partitions, latency, DNS), GPU placement.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from reward_server import domain as d
from reward_server.client import AsyncRewardClient, RetryBudget, RewardCallError
from reward_server.serving import RayEngines
from trainer.ray_head import LocalRayWorker, free_ports

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(420)]  # a second Ray node

REPO = Path(__file__).resolve().parents[3]
PREFIX = "t-mn"
TERMS = [f"w{t}" for t in range(10)]
RULE = "It says " + " ".join(f'"{t}"' for t in TERMS) + "."
BUDGET = RetryBudget(attempts=10, backoff_initial_s=0.1, backoff_cap_s=1.0, deadline_s=60.0)


def item(k: int) -> d.ScoreItem:
    """Item k covers k % 11 of the rule's 10 terms: 11 distinct rewards, a distinct id each."""
    text = " ".join(TERMS[: k % 11]) + f" item {k}"
    return d.ScoreItem(f"i{k}", d.RubricScoreSpec("ctx", text, (RULE,)))


@dataclass
class Ingress:
    proc: subprocess.Popen[str]
    port: int
    metrics_port: int
    log: Path

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a Prometheus counter's samples whose labels include ``labels``."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        total = 0.0
        for line in text.splitlines():
            m = re.match(rf"{name}\{{(.*)\}} (\S+)$", line)
            if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
                total += float(m.group(2))
        return total

    def stop(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start_ingress(address: str, log: Path, *, node_temp_dir: Path | None = None) -> Ingress:
    (metrics_port,) = free_ports(1)
    cmd = [sys.executable, "-m", "reward_server", "serve", "--fake", "--port", "0",
           "--address", address,
           "--set", "serving.ray.deploy=false", "--set", f"serving.ray.app_prefix={PREFIX}",
           "--set", "serving.ray.ready_timeout_s=120", "--set", "server.grace_period_s=2",
           "--set", "server.health_poll_s=0.2", "--set", f"server.metrics_port={metrics_port}",
           "--set", "engines.judge.batching.max_items=16"]
    if node_temp_dir is not None:
        cmd += ["--set", f"serving.ray.node_temp_dir={node_temp_dir}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARD_SERVER")}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=log.open("w"), text=True)
    return Ingress(proc, 0, metrics_port, log)


def wait_listening(ingress: Ingress, timeout_s: float) -> None:
    assert ingress.proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = ingress.proc.stdout.readline()
        if line.startswith("listening on "):
            ingress.port = int(line.strip().rsplit(":", 1)[1])
            return
        if not line and ingress.proc.poll() is not None:
            break
    ingress.proc.kill()
    raise AssertionError(f"ingress did not start (rc={ingress.proc.poll()}); see {ingress.log}")


@dataclass
class Cluster:
    head_node: str
    worker: LocalRayWorker
    worker_node: str
    config: Any  # RewardServerConfig the applications were deployed with
    judge_factory: Any
    engines: RayEngines
    ingresses: list[Ingress]  # [on the head, on the second node]

    async def replica_nodes(self, kind: str) -> dict[str, str]:
        """replica id -> node id, asked of the replicas themselves."""
        stats = await self.engines.batch_stats(kind)  # type: ignore[arg-type]
        return {rid: s["node_id"] for rid, s in stats.items()}


def _alive_nodes(ray: Any) -> list[str]:
    return [n["NodeID"] for n in ray.nodes() if n["Alive"]]


def wait_spread(ray: Any, nodes: set[str], timeout_s: float = 60.0) -> None:
    """Until SPREAD tasks land on every node: the head's scheduler knows the new node (it
    learns of it a moment after the GCS does) before anything is pinned to it."""

    @ray.remote(num_cpus=0)
    def where() -> str:  # nested: pickled by value
        return str(ray.get_runtime_context().get_node_id())

    deadline = time.monotonic() + timeout_s
    seen: set[str] = set()
    while time.monotonic() < deadline:
        seen = set(ray.get([where.options(scheduling_strategy="SPREAD").remote() for _ in range(4)]))
        if seen == nodes:
            return
        time.sleep(0.5)
    raise AssertionError(f"SPREAD tasks reached {seen}, not every node {nodes}")


REPLICA_CPUS = 0.2  # 2 + 2 replicas on the head after the loss, 4 judge in the scale test


def hold(ray: Any, node: str, cpus: float, *, wait: bool = True) -> Any:
    """An idle actor holding ``cpus`` of one node, so the scheduler has no room there
    (``wait=False``: queued on that node until the room is there)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote
    class Hold:  # nested: pickled by value
        def ready(self) -> bool:
            return True

    h = Hold.options(num_cpus=cpus, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
    if wait:
        ray.get(h.ready.remote(), timeout=60)
    return h


async def placement(engines: RayEngines, kind: str) -> tuple[list[str], dict[str, Any]]:
    stats = await engines.batch_stats(kind)  # type: ignore[arg-type]
    return sorted(s["node_id"] for s in stats.values()), stats


async def move_one_replica(ray: Any, engines: RayEngines, kind: str, *, to: str, frm: str) -> Any:
    """Kill one replica on a full ``frm`` (as a crash would), with a holder already queued
    there for the room it frees: Serve's replacement can only start on ``to``. Returns the
    holder (to release)."""
    placed, stats = await placement(engines, kind)
    deadline = time.monotonic() + 60
    while placed != [frm, frm] and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        placed, stats = await placement(engines, kind)
    assert placed == [frm, frm], (kind, placed)
    pin = hold(ray, frm, REPLICA_CPUS, wait=False)
    await asyncio.sleep(1.0)  # queued at frm's raylet before the room frees
    ray.kill(ray.get_actor(next(iter(stats.values()))["actor_name"], namespace="serve"),
             no_restart=True)
    await asyncio.to_thread(ray.get, pin.ready.remote(), timeout=60)
    deadline = time.monotonic() + 60
    while sorted(placed) != sorted([frm, to]) and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        placed, _ = await placement(engines, kind)
    assert sorted(placed) == sorted([frm, to]), (kind, placed)
    return pin


@pytest.fixture(scope="module")
def cluster(ray_session: Any, kit: Any, tmp_path_factory: Any) -> Iterator[Cluster]:
    ray = ray_session
    logs = tmp_path_factory.mktemp("multinode")
    ctx = ray.get_runtime_context()
    head = ctx.get_node_id()
    head_ip = next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == head)
    gcs = ctx.gcs_address
    before = set(_alive_nodes(ray))
    worker = LocalRayWorker(gcs, num_cpus=1, node_ip=head_ip, log_path=logs / "worker.log")
    engines: RayEngines | None = None
    ingresses: list[Ingress] = []
    try:
        worker.start()
        deadline = time.monotonic() + 60
        while not (new := set(_alive_nodes(ray)) - before) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert new, f"the second node did not register; see {worker.log_path}"
        (worker_node,) = new
        wait_spread(ray, {head, worker_node})
        overrides = ["engines.judge.batching.max_items=16"]
        for kind in ("judge", "nli"):
            overrides += [f"serving.ray.{kind}.min_replicas=2", f"serving.ray.{kind}.max_replicas=2"]
        for kind in ("judge", "nli"):
            overrides.append(f"serving.ray.{kind}.num_cpus={REPLICA_CPUS}")
        config = kit.config(PREFIX, overrides)
        judge_factory = kit.judge_factory(latency_s=0.02)
        # placement, forced: the second node full while the replicas start (all on the head),
        # then the head full while one replica of each application is replaced (on the node)
        pin = hold(ray, worker_node, 1.0)
        engines = kit.start(config, judge_factory=judge_factory, nli_factory=kit.nli_factory())
        pins = [hold(ray, head, 2.0 - 4 * REPLICA_CPUS)]  # ray_session: 2 CPUs
        ray.kill(pin)
        for kind in ("judge", "nli"):
            pins.append(asyncio.run(move_one_replica(ray, engines, kind, to=worker_node, frm=head)))
        for p in pins:
            ray.kill(p)
        ingresses = [start_ingress(gcs, logs / "ingress-head.log"),
                     start_ingress(gcs, logs / "ingress-node2.log", node_temp_dir=worker.temp_dir)]
        for ing in ingresses:  # started together, waited for in turn
            wait_listening(ing, 180)
        yield Cluster(head, worker, worker_node, config, judge_factory, engines, ingresses)
    finally:
        for ing in ingresses:
            ing.stop()
        if engines is not None:
            engines.shutdown()
        worker.stop(timeout_s=15)


@pytest.fixture(scope="module")
async def reference(fake_server: Any) -> dict[str, float]:
    """Every item's reward from an in-process server on the same fake judge."""
    out: dict[str, float] = {}
    async with fake_server.client() as c:
        for start in range(0, 2400, 8):
            for r in await c.score([item(k) for k in range(start, start + 8)]):
                assert r.status is d.ItemStatus.OK and r.reward is not None
                out[r.item_id] = r.reward
    assert len(set(out.values())) == 11
    return out


@dataclass
class Load:
    """Score calls of 4 items from several client tasks, every result checked."""

    targets: list[str]
    reference: dict[str, float]
    calls: list[tuple[float, float]] = field(default_factory=list)  # (start, end)
    answered: int = 0
    failed: list[tuple[list[str], str]] = field(default_factory=list)
    misattributed: list[tuple[str, str, float | None]] = field(default_factory=list)

    async def one(self, client: AsyncRewardClient, ks: list[int]) -> None:
        items = [item(k) for k in ks]
        start = time.monotonic()
        try:
            results = await client.score(items)
        except RewardCallError as e:
            self.failed.append(([i.item_id for i in items], f"{e.code.name}: {e.details}"))
            return
        finally:
            self.calls.append((start, time.monotonic()))
        for it, r in zip(items, results, strict=True):
            ok = (r.item_id == it.item_id and r.status is d.ItemStatus.OK
                  and r.reward == pytest.approx(self.reference[it.item_id]))
            if ok:
                self.answered += 1
            else:
                self.misattributed.append((it.item_id, r.item_id, r.reward))
        assert len(results) == len(items)

    @contextlib.asynccontextmanager
    async def clients(self, n: int) -> AsyncIterator[list[AsyncRewardClient]]:
        cs = [AsyncRewardClient(self.targets, retry=BUDGET) for _ in range(n)]
        try:
            yield cs
        finally:
            for c in cs:
                await c.close()


async def watch_health(target: str, stop: asyncio.Event, seen: list[str]) -> None:
    async with AsyncRewardClient(target) as c:
        while not stop.is_set():
            try:
                seen.append(await c.health(timeout_s=2.0))
            except RewardCallError as e:
                seen.append(e.code.name)
            await asyncio.sleep(0.2)


async def _wait(pred: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await asyncio.to_thread(pred):
            return True
        await asyncio.sleep(0.5)
    return bool(await asyncio.to_thread(pred))


async def test_losing_a_node_under_load_loses_and_mixes_no_item(
    cluster: Cluster, reference: dict[str, float]
) -> None:
    head_ingress, node2_ingress = cluster.ingresses
    for kind in ("judge", "nli"):  # one replica on each node
        nodes = await cluster.replica_nodes(kind)
        assert sorted(nodes.values()) == sorted([cluster.head_node, cluster.worker_node]), kind
    tasks, calls_per_task, per_call = 8, 60, 4
    load = Load([i.target for i in cluster.ingresses], reference)
    total = tasks * calls_per_task
    killed_at: list[float] = []
    health: list[str] = []
    stop_health = asyncio.Event()
    unavailable_before = head_ingress.metric("reward_server_rpc_calls_total", code="UNAVAILABLE")
    resent_before = head_ingress.metric("reward_server_engine_calls_total", outcome="retried")

    async def task(c: AsyncRewardClient, t: int) -> None:
        for n in range(calls_per_task):
            k0 = (t * calls_per_task + n) * per_call
            await load.one(c, list(range(k0, k0 + per_call)))

    async def killer() -> None:
        while len(load.calls) < total // 3:
            await asyncio.sleep(0.02)
        killed_at.append(time.monotonic())
        node2_ingress.proc.send_signal(signal.SIGKILL)  # the ingress and the node, together
        cluster.worker.kill()

    watcher = asyncio.ensure_future(watch_health(head_ingress.target, stop_health, health))
    started = time.monotonic()
    async with load.clients(tasks) as clients:
        await asyncio.wait_for(
            asyncio.gather(killer(), *(task(c, t) for t, c in enumerate(clients))), 240
        )
    took = time.monotonic() - started
    (kill,) = killed_at
    in_flight_at_kill = sum(1 for s, e in load.calls if s <= kill <= e)
    # Serve rebuilds both applications' replicas on the surviving node (min = max = 2): two
    # RUNNING replicas that answer, both on the head (a dead replica may still be counted
    # RUNNING until Serve notices, so the replicas themselves are asked)
    async def recovered() -> bool:
        for kind in ("judge", "nli"):
            nodes = await cluster.replica_nodes(kind)
            counts = await asyncio.to_thread(cluster.engines.replica_counts, kind)  # type: ignore[arg-type]
            if counts != {"RUNNING": 2} or sorted(nodes.values()) != [cluster.head_node] * 2:
                return False
        return True

    deadline = time.monotonic() + 90
    while not await recovered() and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    assert await recovered(), [cluster.engines.replica_counts(k) for k in ("judge", "nli")]  # type: ignore[arg-type]
    recovered_s = time.monotonic() - kill
    stop_health.set()
    await watcher
    unavailable = head_ingress.metric("reward_server_rpc_calls_total", code="UNAVAILABLE")
    resent = head_ingress.metric("reward_server_engine_calls_total", outcome="retried")
    latencies = [e - s for s, e in load.calls]
    figures = {
        "items": total * per_call, "answered": load.answered,
        "lost": total * per_call - load.answered - len(load.misattributed),
        "misattributed": len(load.misattributed), "failed_calls": len(load.failed),
        "calls_in_flight_at_kill": in_flight_at_kill,
        "retryable_answers_by_surviving_ingress": unavailable - unavailable_before,
        "engine_calls_resent_by_surviving_ingress": resent - resent_before,
        "max_latency_s": round(max(latencies), 3), "load_s": round(took, 1),
        "replicas_recovered_after_s": round(recovered_s, 1),
        "health_samples": len(health), "health_not_serving": sum(h != "SERVING" for h in health),
    }
    print("multinode fault figures:", figures)
    assert load.failed == [] and load.misattributed == []
    assert load.answered == total * per_call
    assert in_flight_at_kill > 0  # the kill landed under load
    assert health and all(h == "SERVING" for h in health), health  # a replica was always left
    assert not node2_ingress.alive() and head_ingress.alive()


async def test_raising_and_lowering_replicas_under_load_costs_no_call(
    cluster: Cluster, reference: dict[str, float]
) -> None:
    from ray import serve

    from reward_server.serving._private.runtime import judge_application

    live = [i.target for i in cluster.ingresses if i.alive()]
    load = Load(live, reference)
    stop = asyncio.Event()
    app = cluster.engines.app_name("judge")
    deployed = cluster.config.serving.ray

    def redeploy(n: int) -> None:
        """The same application with new replica bounds (what `serve deploy` of an edited
        config does)."""
        judge = deployed.judge.model_copy(update={"min_replicas": n, "max_replicas": n})
        settings = deployed.model_copy(update={"judge": judge})
        application = judge_application(cluster.config.engines, settings,
                                        engine_factory=cluster.judge_factory)
        serve.run(application, name=app, route_prefix=None)  # returns once RUNNING

    async def task(c: AsyncRewardClient, t: int) -> None:
        n = 0
        while not stop.is_set() and n < 400:
            k0 = ((t * 400 + n) * 4) % 2396
            await load.one(c, list(range(k0, k0 + 4)))
            n += 1

    def counts() -> dict[str, int]:
        return cluster.engines.replica_counts("judge")

    async with load.clients(6) as clients:
        work = asyncio.gather(*(task(c, t) for t, c in enumerate(clients)))
        try:
            await asyncio.sleep(1.0)
            await asyncio.to_thread(redeploy, 4)
            assert await _wait(lambda: counts() == {"RUNNING": 4}, 90), counts()
            await asyncio.sleep(1.0)
            await asyncio.to_thread(redeploy, 2)
            assert await _wait(lambda: counts() == {"RUNNING": 2}, 90), counts()
            await asyncio.sleep(1.0)
        finally:
            stop.set()
            await asyncio.wait_for(work, 120)
    print("multinode scale figures:", {"calls": len(load.calls), "answered": load.answered,
                                       "failed_calls": len(load.failed),
                                       "misattributed": len(load.misattributed),
                                       "max_latency_s": round(max(e - s for s, e in load.calls), 3)})
    assert load.failed == [] and load.misattributed == []
    assert load.answered == 4 * len(load.calls)

