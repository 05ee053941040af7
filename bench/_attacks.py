"""bench/faults.py's rows for issue 51: a trainer's load beside admission off, and the attacks
that still bit at the defaults (rapid reset, a CONTINUATION flood, parked half-open calls, HTTP
slow bodies, the connection cap taken by one peer, gzip bombs, huge JSON numbers).

Each attack runs against a `reward-server serve` at its defaults (bench/_faultkit.py), with the
well-behaved client and the health prober beside it, bounded in count and time. The attacker
connects from 127.0.0.2 (another loopback address, standing for another machine), so the
per-peer connection shares apply to it and not to the well-behaved client on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import resource
import statistics
import time
from collections.abc import Awaitable, Callable

import aiohttp
import grpc
from _faultkit import (
    AUTH,
    ONE_ITEM,
    SCORE,
    TOKEN,
    Caller,
    Server,
    codes_of,
    http_post,
    ms,
    phase,
    statuses,
)
from _h2 import RawH2, closed_by_peer, gzip_bomb, idle_socket
from _workload import proc_cpu_s

ATTACKER = "127.0.0.2"
ONE_JSON = json.dumps({"items": [{"id": "a", "nli_constraints": {
    "response": "Paris is big.", "answer": "Paris", "preference": "big"}}]}).encode()


# ------------------------------------------------------------------ trainer load
async def _closed_loops(call: Callable[[], Awaitable[tuple[str, float | None]]], loops: int,
                        seconds: float, warmup_s: float) -> collections.Counter[str]:
    """``loops`` callers calling back to back; a refusal waits its retry hint. Counts the
    outcomes of the calls that ended in the ``seconds`` after ``warmup_s``."""
    start = time.monotonic()
    count_from, end = start + warmup_s, start + warmup_s + seconds
    codes: collections.Counter[str] = collections.Counter()

    async def loop() -> None:
        while time.monotonic() < end:
            code, wait = await call()
            if count_from <= time.monotonic() <= end:
                codes[code] += 1
            if wait is not None:
                await asyncio.sleep(wait)

    await asyncio.gather(*(loop() for _ in range(loops)))
    return codes


async def _grpc_load(s: Server, loops: int, seconds: float) -> collections.Counter[str]:
    caller = Caller(s.target)

    async def call() -> tuple[str, float | None]:
        _lat, code, push = await caller.score(ONE_ITEM, timeout_s=120)
        return code, (push if push is not None else 0.1) if code == "RESOURCE_EXHAUSTED" else None

    try:
        return await _closed_loops(call, loops, seconds, warmup_s=1.0)
    finally:
        await caller.close()


async def _http_load(s: Server, loops: int, seconds: float) -> collections.Counter[str]:
    url = f"http://127.0.0.1:{s.http_port}/v1/score"
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=loops),
                                     timeout=timeout) as session:
        async def call() -> tuple[str, float | None]:
            try:
                async with session.post(url, data=ONE_JSON, headers=headers) as resp:
                    await resp.read()
                    if resp.status == 429:
                        return "429", float(resp.headers.get("Retry-After", "1"))
                    return str(resp.status), None
            except (aiohttp.ClientError, TimeoutError) as e:
                return type(e).__name__, 0.1

        return await _closed_loops(call, loops, seconds, warmup_s=1.0)


def _spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):,.0f} [{min(xs):,.0f}-{max(xs):,.0f}]"


async def trainer_load(common: list[str], args: argparse.Namespace) -> list[str]:
    """A trainer's per-sample load: closed loops of 1-item Score calls (256 and 1,024 of them,
    each on both doors), against the DEFAULT admission and, beside it, a server with admission
    off, in interleaved rounds (two servers running at once; each round alternates which goes
    first). Returns the rows of its table: OK items/s (median and range over the rounds), their
    ratio, refusals and other outcomes."""
    servers = {"default": Server(common, args.engine_latency),
               "admission off": Server([*common, "service.admission.enabled=false"],
                                       args.engine_latency)}
    cells = [(door, loops) for loops in args.trainer_loops for door in ("grpc", "http")]
    ok: dict[tuple[str, int, str], list[float]] = collections.defaultdict(list)
    cpu: dict[tuple[str, int, str], list[float]] = collections.defaultdict(list)  # ms per item
    other: dict[tuple[str, int, str], collections.Counter[str]] = collections.defaultdict(
        collections.Counter)
    try:
        for r in range(args.rounds):
            for door, loops in cells:
                names = list(servers) if r % 2 == 0 else list(reversed(servers))
                for name in names:
                    load = _grpc_load if door == "grpc" else _http_load
                    pid = servers[name].proc.pid
                    c0 = proc_cpu_s(pid)  # warm-up included: a little high, alike for both
                    codes = await load(servers[name], loops, args.trainer_seconds)
                    used = proc_cpu_s(pid) - c0
                    good = codes.pop("OK" if door == "grpc" else "200", 0)
                    ok[(door, loops, name)].append(good / args.trainer_seconds)
                    cpu[(door, loops, name)].append(1000 * used / max(1, good))
                    other[(door, loops, name)].update(codes)
                    print(f"  trainer load round {r + 1}: {door} x{loops} {name}: "
                          f"{good / args.trainer_seconds:,.0f} OK items/s, other {dict(codes)}",
                          flush=True)
    finally:
        for s in servers.values():
            s.stop()
    rows = ["| door | callers | OK items/s, default admission | OK items/s, admission off | "
            "ratio (median [range], rounds paired) | server CPU ms/item, default / off "
            "(median) | default: refused / other | off: other |",
            "|---|---|---|---|---|---|---|---|"]
    for door, loops in cells:
        on, off = ok[(door, loops, "default")], ok[(door, loops, "admission off")]
        ratios = [a / b for a, b in zip(on, off, strict=True) if b]
        refused = {k: v for k, v in other[(door, loops, "default")].items()}
        rows.append(f"| {door} | {loops} | {_spread(on)} | {_spread(off)} | "
                    f"{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}] | "
                    f"{statistics.median(cpu[(door, loops, 'default')]):.2f} / "
                    f"{statistics.median(cpu[(door, loops, 'admission off')]):.2f} | "
                    f"{refused or 0} | {dict(other[(door, loops, 'admission off')]) or 0} |")
    return rows


async def warm_up(s: Server, seconds: float) -> None:
    """A trainer's ordinary peak before the attacks (``--warm``): 1,024 closed loops of 1-item
    calls on each door for ``seconds``, so that each attack's "before" is a server that has
    served its usual load. The RSS such load leaves (the allocators' high-water mark: CPython's
    arenas, glibc's per-thread arenas of gRPC core) is not the attack's: on a fresh server 1,024
    HTTP callers for 10 s left 65 -> 93 MB, more than any HTTP attack."""
    async with phase(s, f"W. warm-up: 1,024 closed loops of 1-item calls, {seconds:.0f} s on "
                        "each door (a trainer's load, not an attack)") as p:
        for door, load in (("grpc", _grpc_load), ("http", _http_load)):
            codes = await load(s, 1024, seconds)
            p.codes.update({f"{door} {k}": v for k, v in codes.items()})
        p.outcome = f"{dict(p.codes)}"


# ------------------------------------------------------------------ issue 51's attacks
def _raise_open_files(want: int) -> None:
    """This process opens thousands of connections (the lockout): raise its soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))


async def rapid_reset(s: Server, args: argparse.Namespace) -> None:
    """CVE-2023-44487: streams reset right after their headers, as fast as this client goes,
    for ``args.attack_seconds``, reconnecting whenever the server closes the connection."""
    async with phase(s, f"J. rapid reset (CVE-2023-44487) from {ATTACKER}, "
                        f"{args.attack_seconds:.0f} s, reconnecting") as p:
        t0 = time.monotonic()
        sent = closed = goaway = unanswered = 0
        while (left := args.attack_seconds - (time.monotonic() - t0)) > 0:
            try:  # the server may drop the connection requests of an address it closed
                c = await asyncio.wait_for(RawH2.open(s.port, source=ATTACKER), left)
            except (TimeoutError, OSError):
                unanswered += 1
                continue
            while time.monotonic() - t0 < args.attack_seconds and not c.closed and c.goaway is None:
                sent += await c.rapid_reset(SCORE, 1000, metadata=AUTH)
            goaway += c.goaway is not None
            closed += c.closed or await c.wait_closed_by_peer(0.5)
            await c.close()
        p.outcome = (f"{sent:,} streams reset in {time.monotonic() - t0:.1f} s; the server closed "
                     f"{closed} connections ({goaway} with GOAWAY)"
                     + (f"; {unanswered} connection attempts unanswered" if unanswered else ""))


async def continuation_flood(s: Server, args: argparse.Namespace) -> None:
    """A HEADERS frame, then CONTINUATION frames that never end the header block, for
    ``args.attack_seconds``, one connection at a time, reconnecting when it is closed."""
    async with phase(s, f"K. CONTINUATION flood from {ATTACKER}, {args.attack_seconds:.0f} s, "
                        "reconnecting") as p:
        t0 = time.monotonic()
        sent = conns = 0
        while (left := args.attack_seconds - (time.monotonic() - t0)) > 0:
            c = await RawH2.open(s.port, source=ATTACKER)
            await c.pump(0.05)
            sent += await c.continuation_flood(SCORE, 64 << 30, timeout_s=left)
            conns += 1
            await c.close()
        p.outcome = (f"{sent / 1e9:.2f} GB sent in {time.monotonic() - t0:.1f} s over {conns} "
                     f"connections (each taken until the server closed it)")


async def parked_calls(s: Server, args: argparse.Namespace) -> None:
    """400 connections x 128 Score calls whose request never comes, held
    ``args.attack_seconds``."""
    n, per = 400, 128
    async with phase(s, f"L. {n} connections x {per} half-open calls from {ATTACKER}, held "
                        f"{args.attack_seconds:.0f} s", settle_s=5.0) as p:
        conns = [await RawH2.open(s.port, source=ATTACKER) for _ in range(n)]
        for c in conns:
            await c.start_calls(SCORE, per, body=None, metadata=AUTH)
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.attack_seconds:
            await asyncio.gather(*(c.pump(0.1) for c in conns))
        codes = collections.Counter(c.grpc_code(sid) for c in conns for sid in c.status)
        closed = sum(c.closed for c in conns)
        p.outcome = (f"{n * per:,} calls; answered to the attacker {_named(codes)}; the server "
                     f"closed {closed} of {n} connections")
        for c in conns:
            await c.close()


def _named(codes: collections.Counter[int | None]) -> dict[str, int]:
    names = {code.value[0]: code.name for code in grpc.StatusCode}
    return {names.get(k, str(k)) if k is not None else "no answer": v for k, v in codes.items()}


async def lockout(s: Server, args: argparse.Namespace) -> None:
    """8,300 connections from one address that send the HTTP/2 preface and hold still (more
    than server.max_connections, 8,192), held ``args.attack_seconds``; opened one after the
    other until one gets no answer within 5 s (the server drops the connection requests of a
    peer at its share)."""
    await _hold_still(s, args, [ATTACKER], "M")


SPREAD = [f"127.0.1.{k}" for k in range(1, 17)]


async def spread_lockout(s: Server, args: argparse.Namespace) -> None:
    """M from 16 addresses (127.0.1.1-16), each under its share: what the per-peer share does
    not cover. 8,300 fit under gRPC's own cap (max_connections + one share, 9,216); health
    is NOT_SERVING while max_connections (8,192) are open."""
    await _hold_still(s, args, SPREAD, "Q")


async def _hold_still(s: Server, args: argparse.Namespace, sources: list[str], row: str) -> None:
    n = args.lockout_connections
    _raise_open_files(n + 1024)
    who = sources[0] if len(sources) == 1 else f"{len(sources)} addresses, {n // len(sources):,}+ each"
    async with phase(s, f"{row}. {n:,} connections from {who} that hold still, "
                        f"{args.attack_seconds:.0f} s (the connection cap)", settle_s=5.0) as p:
        socks = []
        for k in range(n):
            try:
                socks.append(await asyncio.to_thread(idle_socket, s.port,
                                                     source=sources[k % len(sources)]))
            except OSError as e:
                p.outcome = f"(could open only {len(socks)}: {e}) "
                break
        await asyncio.sleep(args.attack_seconds)
        closed = sum(closed_by_peer(k) for k in socks)
        p.outcome += f"{closed:,} of {len(socks):,} closed by the server"
        for k in socks:
            k.close()


async def gzip_bombs(s: Server, args: argparse.Namespace) -> None:
    """128 Score calls at once whose gzip-compressed message inflates to 64 MiB."""
    bomb = gzip_bomb(64 << 20)
    async with phase(s, f"N. 128 gzip bombs at once ({len(bomb) // 1024} KB -> 64 MiB each)") as p:
        conns = [await RawH2.open(s.port, source=ATTACKER) for _ in range(8)]
        t0 = time.monotonic()
        calls = [(c, await c.start_call(SCORE, metadata=(*AUTH, ("grpc-encoding", "gzip")),
                                        body=bomb, end=True)) for c in conns for _ in range(16)]
        seen = await statuses(conns, calls, t0, 120.0)
        p.outcome = (f"{_named(codes_of(calls))}, the last after "
                     f"{max(seen.values(), default=float('nan')):.2f} s")
        for c in conns:
            await c.close()


async def _http(port: int, path: str, data: bytes = b"", method: str = "POST") -> tuple[int, float]:
    """(HTTP status, seconds); status 0 when the connection failed."""
    t = time.perf_counter()
    try:
        status, _ = await asyncio.to_thread(http_post, port, path, data, method=method)
    except OSError:
        status = 0
    return status, time.perf_counter() - t


async def http_slow_bodies(s: Server, args: argparse.Namespace) -> None:
    """1,100 HTTP connections from one address, each a POST /v1/score declaring 10,000 body
    bytes and sending one every 5 s, held ``args.attack_seconds``; /v1/health and a 1-item
    /v1/score asked from 127.0.0.1 meanwhile, each a new connection."""
    n = 1100
    _raise_open_files(n + 1024)
    head = ("POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Length: 10000\r\n\r\n").encode()
    async with phase(s, f"O. {n:,} HTTP slow bodies from {ATTACKER} (a byte every 5 s), "
                        f"{args.attack_seconds:.0f} s; /v1/health and /v1/score asked meanwhile",
                        settle_s=5.0) as p:
        conns = []
        for _ in range(n):
            try:
                conns.append(await asyncio.open_connection("127.0.0.1", s.http_port,
                                                           local_addr=(ATTACKER, 0)))
            except OSError:
                break

        async def drip(writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, ConnectionError):
                writer.write(head)
                while True:
                    writer.write(b" ")
                    await writer.drain()
                    await asyncio.sleep(5.0)

        drips = [asyncio.create_task(drip(w)) for _, w in conns]
        end = time.monotonic() + args.attack_seconds
        health: list[float] = []
        while time.monotonic() < end:
            status, took = await _http(s.http_port, "/v1/health", method="GET")
            p.codes[f"health {status}"] += 1
            health.append(took)
            status, _ = await _http(s.http_port, "/v1/score", ONE_JSON)
            p.codes[f"score {status}"] += 1
            await asyncio.sleep(0.2)
        for t in drips:
            t.cancel()
        closed = sum(closed_by_peer(w.get_extra_info("socket")) for _, w in conns)
        for _, w in conns:
            w.close()
        p.outcome = (f"{len(conns):,} opened, {closed:,} closed by the server; from 127.0.0.1 "
                     f"meanwhile {dict(p.codes)}, /v1/health p99 {ms(health, .99)} ms")


async def http_json_numbers(s: Server, args: argparse.Namespace) -> None:
    """JSON numbers past every range, in a weight, a count and an OpenRLHF label: each a 400."""
    nli = {"response": "Paris is big.", "answer": "Paris", "preference": "big"}
    item = json.dumps({"id": "w", "weighted": {"parts": [{"weight": "N", "nli_constraints": nli}]}})
    label = json.dumps({"id": "w", "weighted": {"parts": [{"weight": "N", "nli_constraints": {
        "answer": "Paris", "preference": "big"}}]}})
    cases = []
    for number in ("9" * 4_300, "9" * 4_301, "9" * 100_000, "1e999", "-1e999", "1" + "0" * 400):
        cases.append(("/v1/score", '{"items": [' + item.replace('"N"', number) + "]}"))
        cases.append(("/openrlhf/reward", json.dumps({"query": ["q r"], "prompts": ["q"],
                                                      "labels": [label.replace('"N"', number)]})))
        cases.append(("/v1/induce_rubrics", '{"history": [{"text": "t"}], "num_samples": '
                      + number + "}"))
    async with phase(s, f"P. HTTP: {len(cases)} bodies with JSON numbers past every range "
                        "(4,300+ digits, 1e999)") as p:
        for path, body in cases:
            status, _ = await _http(s.http_port, path, body.encode())
            p.codes[str(status)] += 1
            p.internal += status == 500
        p.outcome = f"{dict(p.codes)} (400 each is right)"
