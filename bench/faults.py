"""Fault bench: the resource attacks of issues 11 and 26 against a real server on 127.0.0.1,
at the server's DEFAULT settings (``--tuned``: issue 11's tuned ones).

    flock /tmp/cpu-heavy.lock python bench/faults.py          # defaults, ~5 minutes on 2 cores
    flock /tmp/cpu-heavy.lock python bench/faults.py --tuned  # issue 11's settings
    python bench/faults.py --tuned --limit 1024 --seconds 2 --fuzz 200

Beside every attack a well-behaved client (:class:`Victim`) calls Score on a fresh connection
every second; the table gives, per attack, health p99, the server's RSS before / peak / after,
and that client's lost and misattributed calls and any INTERNAL answer.

Each attack runs against a `reward-server serve` subprocess (fake engines that sleep
``--engine-latency`` per batch, standing in for a GPU's forward pass), bounded in count and time;
a baseline without attack is measured first, in the same run. A separate prober process asks
grpc.health.v1 every 20 ms throughout, and a sampler reads the server's RSS every 20 ms ("after":
once the RSS has not moved by 1 MB for 0.5 s, at least 2 s and at most 10 s after the attack
ended, with the server still running and answering the prober; the bench's own channels stay
open). Prints
one table (attack -> outcome, health latency during it, RSS before/peak/after, served and refused
calls with latencies), then the "Done when" checks against it (health p99, RSS back within 10 %,
lost, misattributed and INTERNAL over all rows, the overload ratios).

With ``--tuned`` the admission limit is set explicitly (``--limit`` judgments, 512 by default:
what this ingress, CPU-bound on 2 cores, answers near its unloaded latency); by default it is the
server's own, read from Info. The standard call is
32 items x 4 rules = 128 judgments, so the limit holds ``limit / 128`` such calls at once.
Overload clients honour the server's ``grpc-retry-pushback-ms`` before retrying (gRFC A6).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import random
import signal
import socket
import time

import _faultkit as kit
import grpc
from _attacks import (
    continuation_flood,
    gzip_bombs,
    http_json_numbers,
    http_slow_bodies,
    lockout,
    parked_calls,
    rapid_reset,
    spread_lockout,
    trainer_load,
    warm_up,
)
from _faultkit import (
    AUTH,
    ONE_ITEM,
    ROWS,
    SCORE,
    TOKEN,
    Caller,
    Phase,
    Server,
    Victim,
    bucket_p99,
    closed_loop,
    codes_of,
    http_post,
    limit_now,
    ms,
    phase,
    print_table,
    refusal_stages,
    rubric_request,
    server_latency,
    statuses,
)
from _h2 import RawH2, closed_by_peer, grpc_frame, idle_socket
from _workload import pct

from reward_server import domain as d
from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server.api import convert


def fuzz_request(rng: random.Random) -> bytes:
    """A random request of valid shape at the edges of the limits (some over them, on purpose)."""
    def text(lo: int = 1) -> str:
        alphabet = "abc XYZ é€😀\x00\n\t.!?\"'{}[]"
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(lo, 200)))

    def leaf() -> d.LeafSpec:
        k = rng.randrange(3)
        if k == 0:
            return d.RubricScoreSpec(text(0), text(), tuple(text() for _ in range(rng.randrange(1, 70))),
                                     rng.choice(list(d.Task)), rng.choice([None, *d.RubricAggregate]))
        if k == 1:
            out = rng.choice([f'[{{"rule": "{text()}"}}]', "not json", "[]", text(),
                              '[{"rule": "The text is long enough to pass."}] ' * rng.randrange(1, 12)])
            return d.ParlRewardSpec(tuple(d.HistoryItem(text(0), text()) for _ in range(rng.randrange(1, 66))),
                                    out, d.HistoryItem(text(0), text()),
                                    tuple(text() for _ in range(rng.randrange(0, 18))),
                                    rng.choice(list(d.ParlVariant)), rng.choice(list(d.Task)))
        return d.NliConstraintsSpec(text(0), text(), text(), rng.choice([None, *d.NliRewardFunction]))

    weights = [0.0, 5e-324, 1e-300, 1.0, 1e300, 1e308, rng.random()]
    items = []
    for i in range(rng.randrange(1, 9)):
        spec: d.ItemSpec = leaf()
        if rng.random() < 0.3:
            spec = d.WeightedSpec(tuple(d.WeightedPart(rng.choice(weights), leaf())
                                        for _ in range(rng.randrange(1, 10))))
        item_id = rng.choice([f"u{i}", "é" * rng.randrange(1, 130), ""])
        items.append(convert.item_to_proto(d.ScoreItem(item_id, spec)))
    return pb.ScoreRequest(items=items).SerializeToString()


# ------------------------------------------------------------------ attacks
async def baseline(s: Server, caller: Caller, std: bytes, args: argparse.Namespace) -> tuple[float, float]:
    async with phase(s, "baseline: one call at a time (no attack)") as p:
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            lat, code, _ = await caller.score(std)
            p.codes[code] += 1
            p.served.append(lat)
        p.outcome = f"{dict(p.codes)}"
    unloaded = pct(p.served, .99)
    loops = max(1, round(args.limit / 128))
    async with phase(s, f"baseline: load at the admission limit ({loops} x 128 judgments)") as p:
        await closed_loop(caller, std, loops, args.seconds, p)
        p.outcome = f"{dict(p.codes)}"
    return unloaded, pct(p.served, .99)


async def half_open(s: Server, args: argparse.Namespace, std: bytes) -> None:
    async with phase(s, "1a. 64 half-open Score calls, no token (max_concurrent_rpcs=8)") as p:
        conns = [await RawH2.open(s.port) for _ in range(8)]
        t0 = time.monotonic()
        calls = [(c, await c.start_call(SCORE)) for c in conns for _ in range(8)]
        caller = Caller(s.target)
        served = asyncio.create_task(closed_loop(caller, std, 2, args.seconds, p))
        seen = await statuses(conns, calls, t0, args.seconds)
        await served
        codes = codes_of(calls)
        p.outcome = (f"{codes.get(16, 0)}/64 UNAUTHENTICATED, {codes.get(8, 0)} RESOURCE_EXHAUSTED "
                     f"(grpc's cap), all answered within {max(seen.values(), default=float('nan')) * 1000:.0f} "
                     f"ms; authenticated calls meanwhile {dict(p.codes)}")
        for c in conns:
            await c.close()
        await caller.close()


async def half_open_authenticated(s: Server, args: argparse.Namespace, std: bytes) -> None:
    async with phase(s, f"1b. 64 half-open authenticated calls (receive_timeout_s={args.receive_timeout})") as p:
        conns = [await RawH2.open(s.port) for _ in range(8)]
        t0 = time.monotonic()
        calls = []
        for c in conns:
            for _ in range(8):  # 1 byte of 16, never more
                calls.append((c, await c.start_call(SCORE, metadata=AUTH, body=b"\x00\x00\x00\x10\x00")))
        caller = Caller(s.target)
        served = asyncio.create_task(closed_loop(caller, std, 2, args.receive_timeout + 1, p))
        seen = await statuses(conns, calls, t0, args.receive_timeout + 5)
        await served
        codes = codes_of(calls)
        p.outcome = (f"{codes.get(4, 0)}/64 DEADLINE_EXCEEDED after {min(seen.values(), default=0):.2f}-"
                     f"{max(seen.values(), default=0):.2f} s; other calls meanwhile {dict(p.codes)}")
        for c in conns:
            await c.close()
        await caller.close()


async def half_preface(s: Server, args: argparse.Namespace) -> None:
    async with phase(s, f"1c. 100 half-finished HTTP/2 prefaces (handshake_timeout_s={args.handshake_timeout})") as p:
        socks = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(100)]
        t0 = time.monotonic()
        for k in socks:
            k.sendall(b"PRI * HTTP/2.0\r\n")  # 16 of the preface's 24 bytes, then nothing

        def wait_closed(k: socket.socket) -> float:
            k.settimeout(args.handshake_timeout + 5)
            with contextlib.suppress(OSError):
                while k.recv(65536):
                    pass
            return time.monotonic() - t0

        closed = await asyncio.gather(*(asyncio.to_thread(wait_closed, k) for k in socks))
        p.outcome = f"server closed all 100 after {min(closed):.2f}-{max(closed):.2f} s"
        for k in socks:
            k.close()


async def non_reading(s: Server, args: argparse.Namespace) -> None:
    cases = [("4 MB item ids (as reported)", pb.ScoreRequest(items=[pb.ScoreItem(
                 id="x" * (4 << 20), nli_constraints=pb.NliConstraints(response="r", answer="a", preference="p"))])
              .SerializeToString()),
             ("1,024-item calls, responses never read", rubric_request(1024, 2))]
    for label, body in cases:
        async with phase(s, f"2. 30 non-reading clients, zero HTTP/2 window: {label}", settle_s=3.0) as p:
            conns = []
            frame = grpc_frame(body)
            for _ in range(30):  # each opened just before its call (an idle one is closed)
                c = await RawH2.open(s.port, window=0)
                conns.append(c)
                sid = await c.start_call(SCORE, metadata=AUTH)
                await c.send_body(sid, frame, end=True)
            # ... and never read again; the server's keepalive ping goes unanswered
            t0 = time.monotonic()
            closed_at: dict[int, float] = {}
            while len(closed_at) < len(conns) and time.monotonic() - t0 < min(
                    args.keepalive * 3 + 10, args.wait_close):
                await asyncio.sleep(0.25)
                for i, c in enumerate(conns):
                    if i not in closed_at and c.peer_closed():
                        closed_at[i] = time.monotonic() - t0
            last = max(closed_at.values(), default=float("nan"))
            p.outcome = (f"server closed {len(closed_at)}/30 connections (keepalive) after "
                         f"{last:.1f} s; request {len(body) / 1e6:.1f} MB each")
            for c in conns:
                await c.close()


async def empty_items(s: Server, caller: Caller) -> None:
    body = b"\x0a\x00" * (8 << 20)  # 16 MiB: 8 million empty ScoreItems
    async with phase(s, "A. Score body of only empty items, 16 MiB (x3)") as p:
        for _ in range(3):
            lat, code, _ = await caller.score(body, timeout_s=120)
            p.codes[code] += 1
            (p.served if code == "OK" else p.refused).append(lat)
        p.outcome = f"{dict(p.codes)} in {ms(p.served + p.refused, 1.0)} ms at most"


async def streams_not_read(s: Server, args: argparse.Namespace) -> None:
    n, streams = 16, args.nonreading_streams
    body = rubric_request(1024, 2)
    frame = grpc_frame(body)
    async with phase(s, f"B. {n} zero-window connections x {streams} Score streams of 1,024 "
                        f"items, responses never read", settle_s=5.0) as p:
        conns = [await RawH2.open(s.port, window=0) for _ in range(n)]

        async def send_all(c: RawH2) -> None:
            for _ in range(streams):
                sid = await c.start_call(SCORE, metadata=AUTH)
                await c.send_body(sid, frame, end=True)

        await asyncio.gather(*(send_all(c) for c in conns))
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.hold:  # read frames (statuses), never open the window
            await asyncio.gather(*(c.pump(0.05) for c in conns))
        names = {code.value[0]: code.name for code in grpc.StatusCode}
        got = collections.Counter(names.get(v, str(v)) for c in conns
                                  for v in (c.grpc_code(sid) for sid in c.status) if v is not None)
        p.internal += got.get("INTERNAL", 0)
        p.outcome = (f"{n * streams} calls of {len(body) / 1e6:.2f} MB; answered to the attacker "
                     f"{dict(got)}; held {args.hold:.0f} s, then it disconnected")
        for c in conns:
            await c.close()


async def idle_connections(s: Server, args: argparse.Namespace) -> None:
    """Attack C, twice: gRPC's epoll poller keeps the handle of every connection it closed for
    reuse (a free list, never freed), and those small handles, spread through the thread arenas
    among the connections' freed memory, keep about one page each resident (malloc_trim cannot
    return a page that holds one). So the first wave leaves RSS up by about 8 MB per 1,100
    connections; the second, reusing the handles, should leave it where the first did."""
    n = args.idle_connections
    for wave in ("", " (again: gRPC reuses the first wave's connection handles)"):
        # settle 5 s: the server takes a few seconds to tear 1,100 connections down, and the RSS
        # holds still meanwhile (one run measured "after" at the peak, then it fell)
        async with phase(s, f"C. {n} connections that send only the HTTP/2 preface and SETTINGS, "
                            f"held {args.idle_hold:.0f} s{wave}", settle_s=5.0) as p:
            socks = [idle_socket(s.port) for _ in range(n)]
            await asyncio.sleep(args.idle_hold)
            closed = sum(closed_by_peer(k) for k in socks)
            p.outcome = f"{closed}/{n} closed by the server within {args.idle_hold:.0f} s"
            for k in socks:
                k.close()


async def one_channel(s: Server) -> None:
    from reward_server.client import AsyncRewardClient, RewardCallError

    item = d.ScoreItem("a", d.NliConstraintsSpec("Paris is big.", "Paris", "big"))
    async with phase(s, "E. 512 concurrent 1-item calls on one channel (AsyncRewardClient, "
                        "verl's per-sample pattern) x4") as p:
        async with AsyncRewardClient(s.target, token=TOKEN) as c:
            for _ in range(4):
                t = time.perf_counter()
                res = await asyncio.gather(*(c.score([item]) for _ in range(512)),
                                           return_exceptions=True)
                for r in res:
                    if isinstance(r, RewardCallError):
                        p.codes[r.code.name] += 1
                    elif isinstance(r, BaseException):
                        p.codes[type(r).__name__] += 1
                    else:
                        p.codes["OK"] += 1
                p.served.append(time.perf_counter() - t)
        p.outcome = f"{dict(p.codes)}; lost {sum(v for k, v in p.codes.items() if k != 'OK')}"


async def pending_burst(s: Server) -> None:
    """Issue 26 item 8: 4,096 1-item calls sent at once on 32 connections (128 each, the stream
    limit). They wait in gRPC core until the server takes them, one at a time; past gRPC's own
    limits on such waiting calls (1,000: some cancelled at random; 3,000: all) clients got
    CANCELLED, which they do not retry, until server.max_pending_calls (4,096) set them."""
    frame = grpc_frame(ONE_ITEM)
    async with phase(s, "I. 4,096 1-item calls sent at once on 32 connections") as p:
        conns = [await RawH2.open(s.port) for _ in range(32)]
        for c in conns:
            await c.pump(0.05)  # the server's SETTINGS
        t0 = time.monotonic()
        calls = [(c, sid) for c in conns
                 for sid in await c.start_calls(SCORE, 128, body=frame, metadata=AUTH)]
        seen = await statuses(conns, calls, t0, 60.0)
        names = {code.value[0]: code.name for code in grpc.StatusCode}
        for c, sid in calls:
            code = c.grpc_code(sid)
            p.codes[names.get(code, "no answer" if code is None else str(code))] += 1
            if code == 0:
                p.served.append(seen[(c, sid)])
            elif code == 8:
                p.refused.append(seen[(c, sid)])
        lost = sum(n for k, n in p.codes.items() if k not in ("OK", "RESOURCE_EXHAUSTED"))
        p.outcome = (f"{dict(p.codes)}; lost {lost}; the last answered after "
                     f"{max(seen.values(), default=float('nan')):.2f} s")
        for c in conns:
            await c.close()


async def many_small_calls(s: Server, caller: Caller, args: argparse.Namespace) -> None:
    """Issue 26 item 7: 1,024 concurrent 1-item calls (closed loops honouring pushback)."""
    async with phase(s, "G. 1,024 concurrent 1-item calls (closed loops, pushback honoured)") as p:
        await closed_loop(caller, ONE_ITEM, 1024, args.seconds, p)
        p.outcome = f"{dict(p.codes)}"


async def info_beside_score(s: Server, caller: Caller, args: argparse.Namespace, std: bytes) -> None:
    """Issue 26 item 7: Score throughput at the limit, alone and beside 64 Info callers."""
    info = [ch.unary_unary("/reward.v1.RewardService/Info") for ch in caller._channels]
    loops = max(1, args.limit // 128)
    async with phase(s, f"H. {loops} Score loops at the limit beside 64 Info callers") as p:
        end = time.monotonic() + args.seconds
        infos: collections.Counter[str] = collections.Counter()

        async def asker(k: int) -> None:
            while time.monotonic() < end:
                try:
                    await info[k % len(info)](pb.InfoRequest().SerializeToString(), timeout=10,
                                              metadata=caller._metadata)
                    infos["OK"] += 1
                except grpc.aio.AioRpcError as e:
                    infos[e.code().name] += 1
                    await asyncio.sleep(0.01)

        alone = Phase("alone")
        await closed_loop(caller, std, loops, args.seconds, alone)
        await asyncio.gather(closed_loop(caller, std, loops, args.seconds, p),
                             *(asker(k) for k in range(64)))
        ratio = len(p.served) / max(1, len(alone.served))
        p.outcome = (f"Score served {len(p.served)} beside Info vs {len(alone.served)} alone "
                     f"({ratio:.2f}x); Info {dict(infos)}")


async def http_attacks(s: Server, args: argparse.Namespace) -> None:
    port = s.http_port
    nli = '{"response": "Paris is big.", "answer": "Paris", "preference": "big"}'
    cases = [
        ("64 MiB of {} items", "/v1/score", b'{"items": [' + b",".join([b"{}"] * (21 << 20)) + b"]}"),
        ("a list of 4 million tiny items", "/v1/score",
         b'{"items": [' + b",".join([b'{"id": "x"}'] * (4 << 20)) + b"]}"),
        ("an OpenRLHF label nested 50,000 deep", "/openrlhf/reward", json.dumps(
            {"query": ["q r"], "prompts": ["q"], "labels": ['{"a":' * 50_000 + "1" + "}" * 50_000]}).encode()),
        ('"weight": true', "/v1/score", ('{"items": [{"id": "w", "weighted": {"parts": [{"weight": true, '
                                         f'"nli_constraints": {nli}}}]}}}}]}}').encode()),
    ]
    async with phase(s, "D. HTTP JSON: " + "; ".join(c[0] for c in cases) + "; a text/plain body") as p:
        got = []
        for label, path, body in cases:
            t = time.perf_counter()
            status, _ = await asyncio.to_thread(http_post, port, path, body)
            got.append(f"{label}: {status} in {(time.perf_counter() - t) * 1000:.0f} ms")
            p.codes[str(status)] += 1
            p.internal += status == 500
        status, _ = await asyncio.to_thread(http_post, port, "/v1/score", cases[3][2], "text/plain")
        got.append(f"text/plain: {status}")
        p.outcome = "; ".join(got)
    n = args.http_idle
    async with phase(s, f"F. {n} HTTP connections that send nothing, held {args.idle_hold:.0f} s; "
                        "/v1/health and /v1/score asked meanwhile") as p:
        socks = [idle_socket(port, preface=False) for _ in range(n)]
        end = time.monotonic() + args.idle_hold
        while time.monotonic() < end:
            status, _ = await asyncio.to_thread(http_post, port, "/v1/health", b"", method="GET")
            p.codes[f"health {status}"] += 1
            status, _ = await asyncio.to_thread(
                http_post, port, "/v1/score", f'{{"items": [{{"id": "a", "nli_constraints": {nli}}}]}}'.encode())
            p.codes[f"score {status}"] += 1
            await asyncio.sleep(0.2)
        closed = sum(closed_by_peer(k) for k in socks)
        for k in socks:
            k.close()
        p.outcome = f"{closed}/{n} closed by the server; meanwhile {dict(p.codes)}"


async def big_requests(s: Server, caller: Caller) -> None:
    cases = [("3a. maximum valid request: 1,024 items x 64 rules (65,536 judgments)", rubric_request(1024, 64)),
             ("3b. as reported: 1,024 items x 1,800 rules",
              rubric_request(1024, 1800, text_len=10, short_rules=True)),
             ("3c. one item of 100,000 rules", rubric_request(1, 100_000, text_len=10, short_rules=True)),
             ("3d. one PARL item of 200,000 history items", pb.ScoreRequest(items=[pb.ScoreItem(
                 id="h", parl_reward=pb.ParlReward(history=[pb.HistoryItem(text="t")] * 200_000,
                                                   policy_output="[]", target=pb.HistoryItem(text="t"),
                                                   baselines=["b"], variant=pb.PARL_VARIANT_A))]).SerializeToString())]
    for label, body in cases:
        async with phase(s, label + " (x3)") as p:
            for _ in range(3):
                lat, code, _ = await caller.score(body, timeout_s=120)
                p.codes[code] += 1
                (p.served if code == "OK" else p.refused).append(lat)
            p.outcome = f"{dict(p.codes)} in {ms(p.served + p.refused, 1.0)} ms at most ({len(body) / 1e6:.1f} MB)"


async def watch_limit(metrics_port: int, fallback: int, seen: list[int]) -> None:
    """Append the judgment limit to ``seen`` every 0.25 s until cancelled (a window is 0.5 s)."""
    while True:
        seen.append(await asyncio.to_thread(limit_now, metrics_port, fallback))
        await asyncio.sleep(0.25)


async def overload(s: Server, caller: Caller, std: bytes, args: argparse.Namespace) -> list[Phase]:
    # args.limit: the configured limit (adaptive: its floor, from Info), the level an adaptive
    # limit starts from and returns to once the overload ends. Overload is counted from it, not
    # from where the limit has moved to (shedding lowers it under overload: counted from there,
    # "2x" would be no overload at all once the limit is back at its floor).
    out = []
    for factor in (2, 8):
        loops = max(1, round(factor * args.limit / 128))
        async with phase(s, f"4. {factor}x overload: {loops} x 128 judgments vs limit {args.limit}") as p:
            before = await asyncio.to_thread(server_latency, s.metrics_port, "RESOURCE_EXHAUSTED")
            ok_before = await asyncio.to_thread(server_latency, s.metrics_port, "OK")
            at_start = await asyncio.to_thread(limit_now, s.metrics_port, args.limit)
            stages = await asyncio.to_thread(refusal_stages, s.metrics_port)
            seen: list[int] = []  # the limit while the loops run: "at the end" is read after
            # they stop, when an unloaded server's limit is back at its floor within a window
            watch = asyncio.create_task(watch_limit(s.metrics_port, args.limit, seen))
            await closed_loop(caller, std, loops, args.seconds, p, steady=p.steady,
                              steady_refused=p.steady_refused)
            watch.cancel()
            after = await asyncio.to_thread(server_latency, s.metrics_port, "RESOURCE_EXHAUSTED")
            ok_after = await asyncio.to_thread(server_latency, s.metrics_port, "OK")
            stages = await asyncio.to_thread(refusal_stages, s.metrics_port) - stages
            p.server_refusal_p99 = bucket_p99(before, after)
            shed = await asyncio.to_thread(limit_now, s.metrics_port, args.limit)
            during = f"{min(seen)}-{max(seen)}" if seen else "not read"
            p.outcome = (f"{dict(p.codes)}; refused {dict(stages)}; judgment limit at the start {at_start}, "
                         f"during the load {during} (read every 0.25 s), at the end "
                         f"{shed}; server-side refusal p99 "
                         f"{p.server_refusal_p99}; server-side served p99 "
                         f"{bucket_p99(ok_before, ok_after)}; without the first 0.5 s (all "
                         f"{loops} loops start at once): served p99 {ms(p.steady, .99)} ms, refused "
                         f"p99 {ms(p.steady_refused, .99)} ms")
        out.append(p)
    return out


async def fuzz(s: Server, caller: Caller, n: int) -> collections.Counter[str]:
    rng = random.Random(11)
    async with phase(s, f"6. {n} random requests at the limits' edges (fuzz; refusals for load retried)") as p:
        sem = asyncio.Semaphore(4)

        async def one(body: bytes) -> None:
            async with sem:
                for _ in range(50):  # a refusal for load is no verdict on the request: retry
                    lat, code, push = await caller.score(body)
                    if code != "RESOURCE_EXHAUSTED" or push is None:
                        break
                    await asyncio.sleep(push)
                p.codes[code] += 1
                (p.served if code == "OK" else p.refused).append(lat)

        await asyncio.gather(*(one(fuzz_request(rng)) for _ in range(n)))
        p.outcome = f"{dict(p.codes)}"
    return p.codes


async def codes(s: Server, caller: Caller) -> None:
    async with phase(s, "7. wrong codes: malformed body, 12k-char id, reserved id, 1e308 weights") as p:
        got = []
        for label, body in [
            ("malformed", b"\xff\xff\xff"),
            ("12k id", pb.ScoreRequest(items=[pb.ScoreItem(id="u" * 12_000, nli_constraints=pb.NliConstraints(
                response="r", answer="a", preference="p"))]).SerializeToString()),
            ("'#1' id", pb.ScoreRequest(items=[pb.ScoreItem(id="#1", nli_constraints=pb.NliConstraints(
                response="r", answer="a", preference="p")), pb.ScoreItem(nli_constraints=pb.NliConstraints(
                    response="r", answer="a", preference="p"))]).SerializeToString()),
            ("1e308", pb.ScoreRequest(items=[pb.ScoreItem(id="w", weighted=pb.WeightedCombination(parts=[
                pb.WeightedPart(weight=1e308, nli_constraints=pb.NliConstraints(
                    response="Paris is big.", answer="Paris", preference="big"))] * 3))]).SerializeToString()),
        ]:
            _lat, code, _ = await caller.score(body)
            got.append(f"{label}: {code}")
            p.codes[code] += 1
        p.outcome = "; ".join(got)


async def engine_bug_and_health(args: argparse.Namespace) -> None:
    """In this process: a fake judge with a bug, then one made to fail and recover."""
    from reward_server.app import start_app
    from reward_server.backends.fake import FakeJudge, FakeNLI
    from reward_server.client import AsyncRewardClient, RewardCallError
    from reward_server.config import load_config
    from reward_server.errors import BackendUnavailable

    config = load_config(overrides=["server.port=0", "server.drain_delay_s=0", "server.health_poll_s=0.2",
                                    "engines={judge: {kind: fake}, nli: {kind: fake}}"], env={})
    judge = FakeJudge()
    app = await start_app(config, judge_factory=lambda _s: judge, nli_factory=lambda _s: FakeNLI())
    p = Phase("7/8. engine IndexError; every replica down, then back (in-process server)",
              no_health="n/a (in process)")
    item = d.ScoreItem("a", d.RubricScoreSpec("c", "coffee", ('It says "coffee".',)))
    async with AsyncRewardClient(app.target, max_retries=3, backoff_base_s=0.1) as c:
        judge.fail_with = IndexError("list index out of range")
        try:
            await c.score([item])
            bug = "OK?"
        except RewardCallError as e:
            bug = f"{e.code.name} after {e.attempts} attempt(s)"
        judge.fail_with = BackendUnavailable("no live judge replica")
        t0 = time.monotonic()
        while await c.health() != "NOT_SERVING":
            await asyncio.sleep(0.01)
        down = time.monotonic() - t0
        judge.fail_with = None
        t0 = time.monotonic()
        while await c.health() != "SERVING":
            await asyncio.sleep(0.01)
        up = time.monotonic() - t0
    await app.stop(grace=1, drain_delay=0)
    p.outcome = (f"IndexError -> {bug}; NOT_SERVING {down * 1000:.0f} ms after the engine went down, "
                 f"SERVING {up * 1000:.0f} ms after it came back (health_poll_s=0.2)")
    ROWS.append(p)
    print(f"  {p.name}: {p.outcome}", flush=True)


async def drain(args: argparse.Namespace) -> tuple[int, int]:
    s = Server(["server.grace_period_s=30", "server.drain_delay_s=2", *args.set], args.engine_latency)
    caller = Caller(s.target, token=None)
    body = rubric_request(128, 1)
    p = Phase("5. SIGTERM under load: 32 concurrent x 128 items, grace 30 s, drain_delay 2 s")
    t0 = time.monotonic()
    before = s.rss_now()
    load = asyncio.create_task(closed_loop(caller, body, 32, 60, p, until=lambda: s.proc.poll() is not None))
    await asyncio.sleep(1.5)
    t_term = time.monotonic()
    s.proc.send_signal(signal.SIGTERM)
    rc = await asyncio.to_thread(s.proc.wait, 60)
    took = time.monotonic() - t_term
    await load
    p.health = s.health.between(t0, t_term + took)
    p.health_status = s.health.statuses(t0, t_term + took)
    p.rss = (before, max(mb for _, mb in s.rss), s.rss[-1][1])
    p.exits = True
    s.stop()
    await caller.close()
    p.outcome = f"exit {rc} {took:.1f} s after SIGTERM; calls {dict(p.codes)}"
    ROWS.append(p)
    print(f"  {p.name}: {p.outcome}", flush=True)
    return rc, p.codes.get("CANCELLED", 0)


# ------------------------------------------------------------------ main
TUNED = {"limit": 512, "engine_latency": 0.02, "receive_timeout": 2.0, "handshake_timeout": 2.0,
         "keepalive": 2.0}
DEFAULTS = {"limit": None, "engine_latency": 0.0, "receive_timeout": 30.0, "handshake_timeout": 10.0,
            "keepalive": 60.0}


OVERLOAD_BASE = 512  # judgments: what "at the limit" and "2x / 8x overload" count from at most


def admission_limit(target: str) -> int:
    """The judgments the load rows count from: the server's admission limit from Info
    (adaptive: its floor, the limit until something is measured), at most OVERLOAD_BASE (the
    default fixed limit, 32,768 judgments, is far past what this machine serves: "2x" of it
    would be 512 loops of 128-judgment calls waiting in admission's line, not an overload of
    the engines)."""
    with grpc.insecure_channel(target) as ch:
        info = ch.unary_unary("/reward.v1.RewardService/Info")(
            pb.InfoRequest().SerializeToString(), metadata=(("authorization", f"Bearer {TOKEN}"),),
            timeout=10)
    settings = pb.InfoResponse.FromString(info).settings
    key = "service.admission.min_judgments_in_flight"
    if settings.get("service.admission.adaptive") != "true" or key not in settings:
        key = "service.admission.max_judgments_in_flight"
    return min(OVERLOAD_BASE, int(settings[key]))


ISSUE51 = {"P": http_json_numbers, "N": gzip_bombs, "J": rapid_reset, "K": continuation_flood,
           "O": http_slow_bodies, "L": parked_calls, "M": lockout, "Q": spread_lockout}
ISSUE51_ORDER = "PNJKOLM"  # the order least likely to leave state behind for the next


async def issue51_attacks(s: Server, args: argparse.Namespace) -> None:
    """Issue 51's attacks named by ``args.attacks`` (letters, in order; a letter given again
    runs that attack again, so ``JJJ`` shows whether what it leaves grows with each round)."""
    if args.warm:
        await warm_up(s, args.warm)
    for letter in args.attacks:
        await ISSUE51[letter](s, args)


async def run(args: argparse.Namespace) -> None:
    common = [f"server.auth_token={TOKEN}", "server.drain_delay_s=0"]
    if args.tuned:
        common += [f"service.admission.max_judgments_in_flight={args.limit}",
                   "service.admission.adaptive=false",
                   f"server.receive_timeout_s={args.receive_timeout}",
                   f"server.handshake_timeout_s={args.handshake_timeout}",
                   f"server.keepalive_time_s={args.keepalive}", "server.keepalive_timeout_s=1"]
    common += args.set
    std = rubric_request(32, 4)

    if args.only == "trainer":
        print("\n".join(await trainer_load(common, args)))
        return
    if args.only is not None:  # a quick look at one class while tuning (not the report)
        s = Server(common, args.engine_latency)
        if args.limit is None:
            args.limit = admission_limit(s.target)
        kit.VICTIM = Victim(s.target, TOKEN)
        caller = Caller(s.target)
        await baseline(s, caller, std, args)
        if args.only == "overload":
            await overload(s, caller, std, args)
        elif args.only == "streams":
            await streams_not_read(s, args)
        elif args.only == "connections":  # B then C, as in the full run
            await streams_not_read(s, args)
            await idle_connections(s, args)
        elif args.only == "memory":
            await empty_items(s, caller)
            await big_requests(s, caller)
        elif args.only == "issue51":
            await issue51_attacks(s, args)
        elif args.only == "small":
            await many_small_calls(s, caller, args)
            await pending_burst(s)
        else:
            await big_requests(s, caller)
        await caller.close()
        s.stop()
        print_table()
        return

    print("server 1 (token, grpc's max_concurrent_rpcs=8, as reported): half-open attacks", flush=True)
    s = Server([*common, "server.max_concurrent_rpcs=8"], args.engine_latency)
    await half_open(s, args, std)
    s.stop()

    print("server 2 (token): baseline, half-open, non-reading clients, big requests, overload, "
          "fuzz, codes", flush=True)
    s = Server(common, args.engine_latency)
    if args.limit is None:
        args.limit = admission_limit(s.target)
    kit.VICTIM = Victim(s.target, TOKEN)
    caller = Caller(s.target)
    unloaded_p99, at_limit_p99 = await baseline(s, caller, std, args)
    await empty_items(s, caller)
    await streams_not_read(s, args)
    await idle_connections(s, args)
    await one_channel(s)
    await many_small_calls(s, caller, args)
    await pending_burst(s)
    await info_beside_score(s, caller, args, std)
    await http_attacks(s, args)
    await half_open_authenticated(s, args, std)
    await half_preface(s, args)
    await non_reading(s, args)
    await big_requests(s, caller)
    overloads = await overload(s, caller, std, args)
    await issue51_attacks(s, args)
    fuzz_codes = await fuzz(s, caller, args.fuzz)
    await codes(s, caller)
    await caller.close()
    s.stop()

    kit.VICTIM = None
    await engine_bug_and_health(args)
    print("server 3 (defaults): drain under load", flush=True)
    rc, cancelled = await drain(args)
    print("servers 4 and 5 (defaults, and admission off): a trainer's load, interleaved", flush=True)
    trainer_rows = await trainer_load(common, args)

    print_table()
    health_p99 = max((pct(p.health, .99) for p in ROWS if p.health), default=float("nan"))
    worst = max((p for p in ROWS if p.health), key=lambda p: pct(p.health, .99))
    nonreading = [p for p in ROWS if p.name.startswith("2.")]
    print()
    print("Done when, from this run:")
    print(f"- health p99 under every attack: worst {health_p99 * 1000:.1f} ms ({worst.name}); target <= 100 ms")
    back = [p for p in ROWS if p.rss and not p.exits]
    if back:  # the RSS after each attack against before it (the drain row ends the server)
        far = max(back, key=lambda p: p.rss[2] / p.rss[0])
        high = max(back, key=lambda p: p.rss[1] / p.rss[0])
        print(f"- RSS after each attack within 10 % of before: "
              f"{sum(p.rss[2] <= 1.1 * p.rss[0] for p in back)} of {len(back)} rows; "
              f"the highest {100 * (far.rss[2] / far.rss[0] - 1):+.1f} % ({far.name}); the highest "
              f"peak {high.rss[1]:.0f} MB = {high.rss[1] / high.rss[0]:.2f}x its before ({high.name})")
    print(f"- the well-behaved client, over all rows: {sum(p.victim.get('lost', 0) for p in ROWS)} lost, "
          f"{sum(p.victim.get('misattributed', 0) for p in ROWS)} misattributed; INTERNAL seen by "
          f"anyone: {sum(p.internal for p in ROWS)}")
    for p in overloads:
        print(f"- {p.name[3:].split(':')[0]}: "
              f"admitted p99 {ms(p.served, .99)} ms = {pct(p.served, .99) / unloaded_p99:.2f}x the "
              f"unloaded p99 ({unloaded_p99 * 1000:.1f} ms; the adaptive limits' target <= 2x; "
              f"the default line queues instead), "
              f"{pct(p.served, .99) / at_limit_p99:.2f}x the p99 at the limit ({at_limit_p99 * 1000:.1f} ms); "
              f"refusal p99 {ms(p.refused, .99)} ms as the client saw it, {p.server_refusal_p99} in the "
              f"server. From 0.5 s on (the burst's onset excluded: all loops start at "
              f"once): admitted p99 {ms(p.steady, .99)} ms = "
              f"{pct(p.steady, .99) / unloaded_p99 if p.steady else float('nan'):.2f}x, refusal p99 "
              f"{ms(p.steady_refused, .99)} ms")
    for p in nonreading:
        print(f"- RSS with 30 non-reading clients ({p.name[2:].split(': ', 1)[1]}): "
              f"{p.rss[0]:.0f} -> peak {p.rss[1]:.0f} -> {p.rss[2]:.0f} MB (+{p.rss[1] - p.rss[0]:.0f} MB)")
    print(f"- drain: {cancelled} CANCELLED, exit code {rc}")
    issue51 = [p for p in ROWS if p.name[:2] in ("J.", "K.", "L.", "M.", "N.", "O.", "P.")]
    for p in issue51:
        rss = f"{100 * (p.rss[2] / p.rss[0] - 1):+.1f} %" if p.rss else "n/a"
        print(f"- {p.name.split(' ', 1)[0]} health p99 {ms(p.health, .99)} ms (<= 100), the "
              f"well-behaved client lost {p.victim.get('lost', 0)} (0), RSS after {rss} "
              f"(within 10 %), INTERNAL {p.internal}")
    print()
    print("A trainer's load (issue 51): OK items/s at the default admission >= 0.95x admission "
          "off, no refusal")
    print("\n".join(trainer_rows))
    print(f"- INTERNAL from the fuzzed requests: {fuzz_codes.get('INTERNAL', 0)} "
          f"(of {sum(fuzz_codes.values())}: {dict(fuzz_codes)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tuned", action="store_true", help="issue 11's tuned settings (admission "
                    "limit 512, fakes sleeping 20 ms, 2 s timeouts and keepalive) instead of the "
                    "server's defaults")
    ap.add_argument("--limit", type=int, help="service.admission.max_judgments_in_flight (with "
                    "--tuned; default: the server's own, read from Info)")
    ap.add_argument("--engine-latency", type=float, help="fake engines' sleep per batch (s)")
    ap.add_argument("--seconds", type=float, default=3.0, help="length of each load phase")
    ap.add_argument("--receive-timeout", type=float)
    ap.add_argument("--handshake-timeout", type=float)
    ap.add_argument("--keepalive", type=float, help="server.keepalive_time_s")
    ap.add_argument("--nonreading-streams", type=int, default=32,
                    help="streams per zero-window connection in attack B (16 connections)")
    ap.add_argument("--hold", type=float, default=5.0, help="how long attack B's peers stay")
    ap.add_argument("--idle-connections", type=int, default=1100)
    ap.add_argument("--idle-hold", type=float, default=20.0,
                    help="how long attack C's connections stay (the default idle close, "
                    "server.max_connection_idle_s, is 120 s)")
    ap.add_argument("--http-idle", type=int, default=1000, help="idle connections in attack F")
    ap.add_argument("--wait-close", type=float, default=15.0,
                    help="longest wait for the server to close non-reading peers (attack 2)")
    ap.add_argument("--fuzz", type=int, default=400, help="random requests")
    ap.add_argument("--timeout", type=float, default=600, help="give up after this long")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a server setting for every `reward-server serve` it starts (as its --set; "
                    "repeatable; not the in-process engine-failure check), e.g. to try a "
                    "setting against the defaults")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the trainer load")
    ap.add_argument("--trainer-seconds", type=float, default=5.0,
                    help="seconds each trainer-load cell is counted (after 1 s of warm-up)")
    ap.add_argument("--trainer-loops", type=int, nargs="+", default=[256, 1024],
                    help="closed loops of 1-item calls in the trainer-load rows")
    ap.add_argument("--attack-seconds", type=float, default=20.0,
                    help="how long each of issue 51's attacks (J-O) goes on")
    ap.add_argument("--lockout-connections", type=int, default=8300,
                    help="connections of attacks M and Q (server.max_connections is 8,192)")
    ap.add_argument("--warm", type=float, default=0.0, metavar="SECONDS",
                    help="before issue 51's attacks, a trainer's load (1,024 closed loops of "
                    "1-item calls) on each door for this long, so that each attack's RSS "
                    "before is a server that served its usual peak (default 0: none)")
    ap.add_argument("--attacks", default=ISSUE51_ORDER, type=str.upper,
                    help=f"which of issue 51's attacks run, in order (default {ISSUE51_ORDER}; a "
                    "letter given twice runs twice, e.g. JJJ; Q, M from 16 addresses, runs only "
                    "when named)")
    ap.add_argument("--only", choices=["overload", "streams", "connections", "big", "memory", "small",
                                       "trainer", "issue51"],
                    help="run only the baselines and one class: the overload (4), attack B "
                    "(streams), B and then C (connections), the large requests (3a-3d), attack A "
                    "and then 3a-3d (memory: the large messages whose RSS stays), or the 1,024 "
                    "1-item callers (G, small)")
    args = ap.parse_args()
    if unknown := set(args.attacks) - set(ISSUE51):
        ap.error(f"--attacks: no attack {''.join(sorted(unknown))} (known: {''.join(ISSUE51)})")
    for k, v in (TUNED if args.tuned else DEFAULTS).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    asyncio.run(asyncio.wait_for(run(args), args.timeout))


if __name__ == "__main__":
    main()
