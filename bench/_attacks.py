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
import json
import statistics
import time
from collections.abc import Awaitable, Callable

import aiohttp
from _faultkit import ONE_ITEM, TOKEN, Caller, Server

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
    other: dict[tuple[str, int, str], collections.Counter[str]] = collections.defaultdict(
        collections.Counter)
    try:
        for r in range(args.rounds):
            for door, loops in cells:
                names = list(servers) if r % 2 == 0 else list(reversed(servers))
                for name in names:
                    load = _grpc_load if door == "grpc" else _http_load
                    codes = await load(servers[name], loops, args.trainer_seconds)
                    good = codes.pop("OK" if door == "grpc" else "200", 0)
                    ok[(door, loops, name)].append(good / args.trainer_seconds)
                    other[(door, loops, name)].update(codes)
                    print(f"  trainer load round {r + 1}: {door} x{loops} {name}: "
                          f"{good / args.trainer_seconds:,.0f} OK items/s, other {dict(codes)}",
                          flush=True)
    finally:
        for s in servers.values():
            s.stop()
    rows = ["| door | callers | OK items/s, default admission | OK items/s, admission off | "
            "ratio (median [range], rounds paired) | default: refused / other | off: other |",
            "|---|---|---|---|---|---|---|"]
    for door, loops in cells:
        on, off = ok[(door, loops, "default")], ok[(door, loops, "admission off")]
        ratios = [a / b for a, b in zip(on, off, strict=True) if b]
        refused = {k: v for k, v in other[(door, loops, "default")].items()}
        rows.append(f"| {door} | {loops} | {_spread(on)} | {_spread(off)} | "
                    f"{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}] | "
                    f"{refused or 0} | {dict(other[(door, loops, 'admission off')]) or 0} |")
    return rows
