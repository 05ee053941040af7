"""What bench/faults.py's attacks share: the server under attack (`reward-server serve` in a
subprocess, its RSS sampled every 20 ms), a separate health prober, the well-behaved client beside
every attack (:class:`Victim`), phases (one row of the table each), raw-bytes gRPC callers and
closed loops. ``python bench/_faultkit.py TARGET`` is the prober's process.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from _h2 import RawH2
from _workload import free_port, pct

from reward_server._proto.reward.v1 import reward_pb2 as pb

REPO = Path(__file__).resolve().parents[1]
SCORE = "/reward.v1.RewardService/Score"
TOKEN = "bench-token"
PUSHBACK = "grpc-retry-pushback-ms"


# ------------------------------------------------------------------ requests
def rubric_request(n: int, rules: int, *, id_prefix: str = "i", text_len: int = 120,
                   short_rules: bool = False) -> bytes:
    rule_texts = [f'Says "w{k}" at least once.' if short_rules
                  else f'The text mentions "word{k}" in a sentence of its own.' for k in range(rules)]
    return pb.ScoreRequest(items=[
        pb.ScoreItem(id=f"{id_prefix}{i}", rubric_score=pb.RubricScore(
            context="ctx", text=f"word{i % 5} " + "x" * text_len, rules=rule_texts))
        for i in range(n)
    ]).SerializeToString()


# ------------------------------------------------------------------ the server and samplers
class Server:
    """`reward-server serve` in a subprocess, with its RSS sampled every 20 ms."""

    def __init__(self, overrides: list[str], engine_latency: float) -> None:
        engines = (f"engines={{judge: {{kind: fake, latency_s: {engine_latency}}}, "
                   f"nli: {{kind: fake, latency_s: {engine_latency}}}}}")
        self.metrics_port = free_port()
        self.http_port = free_port()
        cmd = [sys.executable, "-m", "reward_server", "serve", "--port", "0", "--set", engines,
               "--set", f"server.metrics_port={self.metrics_port}",
               "--set", f"server.http.port={self.http_port}"]
        for o in overrides:
            cmd += ["--set", o]
        env = {k: v for k, v in os.environ.items() if not k.startswith("REWARD_SERVER")}
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            self.proc.kill()
            raise SystemExit(f"server did not start: {line!r}")
        self.port = int(line.strip().rsplit(":", 1)[1])
        self.target = f"127.0.0.1:{self.port}"
        self.rss: list[tuple[float, float]] = []
        self._stop = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()
        self.health = HealthProber(self.target)

    def _sample(self) -> None:
        path = f"/proc/{self.proc.pid}/status"
        while not self._stop.is_set():
            try:
                with open(path) as fh:
                    kb = next(int(ln.split()[1]) for ln in fh if ln.startswith("VmRSS:"))
                self.rss.append((time.monotonic(), kb / 1024))
            except (OSError, StopIteration):
                return
            time.sleep(0.02)

    def rss_now(self) -> float:
        return self.rss[-1][1] if self.rss else float("nan")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60) -> int:
        self.health.stop()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self._stop.set()
        return rc


def server_latency(metrics_port: int, code: str) -> dict[float, float]:
    """Cumulative counts of the server's own Score latency histogram for ``code`` (le -> n), over
    gRPC (the HTTP door's calls are counted apart)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    out: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith("reward_server_rpc_latency_seconds_bucket{") and 'rpc="Score"' in line \
                and f'code="{code}"' in line and 'transport="grpc"' in line:
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[float("inf") if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def refusal_stages(metrics_port: int) -> collections.Counter[str]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    out: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        if line.startswith("reward_server_admission_refused_total{"):
            stage = line.split('stage="', 1)[1].split('"', 1)[0]
            out[stage] += int(float(line.rsplit(" ", 1)[1]))
    return out


def limit_now(metrics_port: int, fallback: int) -> int:
    """The server's judgment limit in force now (adaptive: from its metrics gauge)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith('reward_server_admission_limit{unit="judgments"}'):
            return int(float(line.rsplit(" ", 1)[1]))
    return fallback


def bucket_p99(before: dict[float, float], after: dict[float, float]) -> str:
    """The histogram bucket holding the 99th percentile of what was observed in between."""
    delta = {le: after.get(le, 0.0) - before.get(le, 0.0) for le in after}
    total = delta.get(float("inf"), 0.0)
    if total <= 0:
        return "-"
    for le in sorted(delta):
        if delta[le] >= 0.99 * total:
            return f"<= {le * 1000:g} ms" if le != float("inf") else "> largest bucket"
    return "-"


class HealthProber:
    """`faults.py --probe TARGET` in a subprocess: one health check every 20 ms, timestamped."""

    def __init__(self, target: str) -> None:
        self.samples: list[tuple[float, float, str]] = []  # (sent at, latency s, status)
        self.proc = subprocess.Popen([sys.executable, __file__, target],
                                     stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            t, lat, status = line.split()
            self.samples.append((float(t), float(lat), status))

    def between(self, t0: float, t1: float) -> list[float]:
        return [lat for t, lat, _ in self.samples if t0 <= t <= t1]

    def statuses(self, t0: float, t1: float) -> collections.Counter[str]:
        return collections.Counter(st for t, _, st in self.samples if t0 <= t <= t1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(5)


def probe_main(target: str) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    channel = grpc.insecure_channel(target)
    stub = health_pb2_grpc.HealthStub(channel)
    name = health_pb2.HealthCheckResponse.ServingStatus.Name
    while True:
        t = time.monotonic()
        try:
            status = name(stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status)
        except grpc.RpcError as e:
            status = e.code().name
        print(f"{t:.6f} {time.monotonic() - t:.6f} {status}", flush=True)
        time.sleep(max(0.0, 0.02 - (time.monotonic() - t)))


# ------------------------------------------------------------------ phases and the table
@dataclass
class Phase:
    name: str
    outcome: str = ""
    served: list[float] = field(default_factory=list)
    steady: list[float] = field(default_factory=list)  # overload: served, from 0.5 s on
    steady_refused: list[float] = field(default_factory=list)  # overload: refused, from 0.5 s on
    refused: list[float] = field(default_factory=list)
    codes: collections.Counter[str] = field(default_factory=collections.Counter)
    health: list[float] = field(default_factory=list)
    health_status: collections.Counter[str] = field(default_factory=collections.Counter)
    rss: tuple[float, float, float] | None = None
    exits: bool = False  # the attack ends the server: no "after", its memory goes with it
    no_health: str = "no check in this short phase"
    server_refusal_p99: str = "-"
    victim: collections.Counter[str] = field(default_factory=collections.Counter)
    internal: int = 0  # INTERNAL answers seen by anyone in the phase (attack calls included)


ROWS: list[Phase] = []
AFTER_MAX_S = 10.0


class Victim:
    """A well-behaved client beside every attack: one Score call of 4 items at a time, with
    ids unique to the call, on a fresh connection every second (so a new client must get in),
    honouring the pushback of a refusal. Counts per phase: ok, refused (RESOURCE_EXHAUSTED,
    retried), lost (any other code: the call failed), misattributed (an OK answer whose result
    ids are not the request's, in order), INTERNAL."""

    def __init__(self, target: str, token: str | None) -> None:
        self._target = target
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.counts: collections.Counter[str] = collections.Counter()
        self._n = 0
        self._task: asyncio.Task[None] | None = None
        self._since: float | None = None  # when the call in flight was sent
        self._last: str | None = None  # how the last call ended

    def start(self) -> None:
        self.counts = collections.Counter()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> collections.Counter[str]:
        assert self._task is not None
        if self._since is not None and time.monotonic() - self._since > 1.0:
            # unanswered for over a second when the attack ended: lost, unless it is answered
            # within 10 s more (then "slow", with what it got and after how long)
            since = self._since
            self._last = None
            for _ in range(100):
                if self._last is not None:
                    break
                await asyncio.sleep(0.1)
            if self._last is None:
                self.counts["lost"] += 1
                self.counts["code stalled"] += 1
            else:
                self.counts[f"slow: {self._last} after {time.monotonic() - since:.1f} s"] += 1
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        return self.counts

    def _request(self) -> tuple[bytes, list[str]]:
        self._n += 1
        ids = [f"v{self._n}-{k}" for k in range(4)]
        return pb.ScoreRequest(items=[pb.ScoreItem(id=i, rubric_score=pb.RubricScore(
            context="ctx", text=f"word{k} text", rules=['It says "word1".']))
            for k, i in enumerate(ids)]).SerializeToString(), ids

    async def _loop(self) -> None:
        while True:
            async with grpc.aio.insecure_channel(self._target) as ch:
                call = ch.unary_unary(SCORE)
                until = time.monotonic() + 1.0
                while time.monotonic() < until:
                    raw, ids = self._request()
                    self._since = time.monotonic()
                    try:
                        reply = pb.ScoreResponse.FromString(
                            await call(raw, timeout=30, metadata=self._metadata))
                    except grpc.aio.AioRpcError as e:
                        self._since = None
                        code = e.code().name
                        self._last = code
                        self.counts["refused" if code == "RESOURCE_EXHAUSTED" else "lost"] += 1
                        self.counts[f"code {code}"] += 1
                        if code == "INTERNAL":
                            self.counts["INTERNAL"] += 1
                        await asyncio.sleep(0.1)
                        continue
                    self._since = None
                    self._last = "OK"
                    if [r.id for r in reply.results] != ids:
                        self.counts["misattributed"] += 1
                    else:
                        self.counts["ok"] += 1
                    await asyncio.sleep(0.02)


VICTIM: Victim | None = None


@contextlib.asynccontextmanager
async def phase(server: Server, name: str, settle_s: float = 2.0) -> AsyncIterator[Phase]:
    p = Phase(name)
    await asyncio.sleep(0.2)
    before, t0 = server.rss_now(), time.monotonic()
    if VICTIM is not None:
        VICTIM.start()
    yield p
    t1 = time.monotonic()
    if VICTIM is not None:
        p.victim = await VICTIM.stop()
    p.internal += p.codes.get("INTERNAL", 0) + p.victim.get("INTERNAL", 0)
    await asyncio.sleep(settle_s)
    # "after": the server still running and answering the prober's health checks, once its
    # RSS has not moved by 1 MB for 0.5 s (it trims when idle), at most AFTER_MAX_S after
    # the attack ended
    while time.monotonic() - t1 < AFTER_MAX_S:
        recent = [mb for t, mb in server.rss if t >= time.monotonic() - 0.5]
        if recent and max(recent) - min(recent) < 1.0:
            break
        await asyncio.sleep(0.1)
    peak = max((mb for t, mb in server.rss if t0 <= t), default=before)
    p.rss = (before, peak, server.rss_now())
    p.health = server.health.between(t0, t1)
    p.health_status = server.health.statuses(t0, t1)
    ROWS.append(p)
    print(f"  {name}: {p.outcome}", flush=True)


def ms(xs: list[float], q: float) -> str:
    return f"{pct(xs, q) * 1000:.1f}" if xs else "-"


def print_table() -> None:
    print()
    print("| attack | outcome | health p99 ms (n) | RSS MB before / peak / after "
          "| served n, p50 / p99 ms | refused n, p50 / p99 ms | victim ok / refused "
          "| lost | misattributed | INTERNAL |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for p in ROWS:
        other = {k: v for k, v in p.health_status.items() if k != "SERVING"}
        h = (f"{ms(p.health, .99)} ({len(p.health)}" + (f"; {other}" if other else "") + ")"
             if p.health else p.no_health)
        r = ("{:.0f} / {:.0f} / {:.0f} ({:+.1f} %)".format(*p.rss, 100 * (p.rss[2] / p.rss[0] - 1))
             if p.rss else "n/a")  # after over before: the "back within 10 %"
        if p.rss and p.exits:  # the last sample is the server draining under load, not after it
            r = "{:.0f} / {:.0f} / exited (last sample, draining: {:.0f})".format(*p.rss)
        s = f"{len(p.served)}, {ms(p.served, .5)} / {ms(p.served, .99)}"
        f = f"{len(p.refused)}, {ms(p.refused, .5)} / {ms(p.refused, .99)}"
        v = p.victim
        lost_codes = {k[5:]: n for k, n in v.items() if k.startswith("code ") and k != "code RESOURCE_EXHAUSTED"}
        slow = [k for k in v if k.startswith("slow: ")]  # answered, but over 1 s
        lost = (f"{v.get('lost', 0)}" + (f" {lost_codes}" if lost_codes else "")
                + (f" (slow, not lost: {'; '.join(k[6:] for k in slow)})" if slow else ""))
        print(f"| {p.name} | {p.outcome} | {h} | {r} | {s} | {f} | {v.get('ok', 0)} / "
              f"{v.get('refused', 0)} | {lost} | {v.get('misattributed', 0)} | {p.internal} |")


# ------------------------------------------------------------------ clients
class Caller:
    """Raw-bytes Score calls over a few channels (no client-side conversion in the timing).
    gRPC shares one connection among channels to the same target with the same options (its
    global subchannel pool), so these calls are the streams of ONE connection (``ss``: 1)."""

    def __init__(self, target: str, *, token: str | None = TOKEN, channels: int = 8) -> None:
        opts = [("grpc.max_receive_message_length", 1 << 28), ("grpc.max_send_message_length", 1 << 28)]
        self._channels = [grpc.aio.insecure_channel(target, options=opts) for _ in range(channels)]
        self._calls = [ch.unary_unary(SCORE) for ch in self._channels]
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._next = 0

    async def score(self, raw: bytes, timeout_s: float = 60) -> tuple[float, str, float | None]:
        """(latency s, code name, pushback s)."""
        call = self._calls[self._next % len(self._calls)]
        self._next += 1
        t = time.perf_counter()
        try:
            await call(raw, timeout=timeout_s, metadata=self._metadata)
            return time.perf_counter() - t, "OK", None
        except grpc.aio.AioRpcError as e:
            lat = time.perf_counter() - t
            meta = dict(e.trailing_metadata() or ())
            push = meta.get(PUSHBACK)
            return lat, e.code().name, (int(push) / 1000 if push is not None else None)

    async def close(self) -> None:
        for ch in self._channels:
            await ch.close()


async def closed_loop(caller: Caller, raw: bytes, loops: int, seconds: float, p: Phase,
                      *, until: Callable[[], bool] | None = None, unavailable_wait_s: float = 0.05,
                      steady: list[float] | None = None, steady_refused: list[float] | None = None,
                      onset_s: float = 0.5) -> None:
    """``loops`` clients calling back to back for ``seconds``; a refusal waits its pushback
    (gRFC A6), UNAVAILABLE waits ``unavailable_wait_s``. ``steady`` / ``steady_refused``: also
    get the latencies of the calls served / refused that started ``onset_s`` or more after the
    loops did (all loops start at once: the first calls of such a burst wait together in gRPC
    core's queue of calls the server has not taken yet, which the server takes about one per
    five event-loop turns, docs/performance.md, "Where the overload latency is")."""
    start = time.monotonic()
    end = start + seconds

    async def one() -> None:
        while time.monotonic() < end and not (until and until()):
            sent = time.monotonic()
            lat, code, push = await caller.score(raw)
            p.codes[code] += 1
            if code == "OK":
                p.served.append(lat)
                if steady is not None and sent - start >= onset_s:
                    steady.append(lat)
            elif code == "RESOURCE_EXHAUSTED":
                p.refused.append(lat)
                if steady_refused is not None and sent - start >= onset_s:
                    steady_refused.append(lat)
                await asyncio.sleep(push if push is not None else 0.1)
            elif code == "UNAVAILABLE":
                await asyncio.sleep(unavailable_wait_s)

    await asyncio.gather(*(one() for _ in range(loops)))


ONE_ITEM = pb.ScoreRequest(items=[pb.ScoreItem(id="a", nli_constraints=pb.NliConstraints(
    response="Paris is big.", answer="Paris", preference="big"))]).SerializeToString()


async def statuses(conns: list[RawH2], calls: list[tuple[RawH2, int]], t0: float,
                   limit_s: float) -> dict[tuple[RawH2, int], float]:
    """When (seconds after ``t0``) each call's grpc-status arrived, within ``limit_s``."""
    seen: dict[tuple[RawH2, int], float] = {}
    mine = {c: [call for call in calls if call[0] is c] for c in conns}

    async def watch(c: RawH2) -> None:
        while time.monotonic() - t0 < limit_s:
            for call in mine[c]:
                if call not in seen and c.grpc_code(call[1]) is not None:
                    seen[call] = time.monotonic() - t0
            if all(call in seen for call in mine[c]) or not await c.pump(0.05):
                return

    await asyncio.gather(*(watch(c) for c in conns))
    return seen


def codes_of(calls: list[tuple[RawH2, int]]) -> collections.Counter[int | None]:
    return collections.Counter(c.grpc_code(sid) for c, sid in calls)


AUTH = (("authorization", f"Bearer {TOKEN}"),)


def http_post(port: int, path: str, data: bytes, content_type: str = "application/json",
              method: str = "POST") -> tuple[int, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data if method == "POST" else None,
                                 method=method, headers={"Content-Type": content_type,
                                                         "Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read().decode()[:200]
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()[:200]


if __name__ == "__main__":  # the health prober's process (HealthProber)
    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
        probe_main(sys.argv[1])
