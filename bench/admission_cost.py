"""What admission's own bookkeeping costs an admitted call, in process: the steps the gRPC
door takes per Score call (``refusal``, ``arrive``, ``add_bytes``, ``admit``, ``release``) with
the default :class:`~reward_server.service.settings.AdmissionSettings` against admission off,
interleaved in one run.

    python bench/admission_cost.py                 # 50,000 calls x 7 rounds, 0 and 1,024 held
    python bench/admission_cost.py --calls 200000 --rounds 11

Each round times ``--calls`` 1-item calls one after another on one event loop, first with
nothing else admitted, then with ``--held`` calls admitted and held (a trainer's closed loop of
1,024 callers has up to that many in flight), for each variant in turn, the order alternating
by round. It prints microseconds per call (median and range over rounds) and the difference,
default minus off: the CPU a call spends in admission beyond what the off path spends. Beside
it, for scale: the server's CPU per item in ``python bench/faults.py --only trainer`` is about
0.6-1.3 ms on this 2-core machine (its own column). No network, no engines: this is the
admission code alone, not a throughput claim for the server.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from reward_server.service.admission import Admission
from reward_server.service.service import DEFAULT_ENGINE_BATCH_ITEMS
from reward_server.service.settings import AdmissionSettings

REQUEST_BYTES = 160  # a 1-item Score request's serialized size, about


async def _calls(admission: Admission, n: int, held: int) -> float:
    """Seconds per call for ``n`` calls through every step, ``held`` others admitted meanwhile."""
    loop = asyncio.get_running_loop()
    keep = []
    for _ in range(held):
        t = await admission.arrive(deadline=loop.time() + 60.0)
        t.add_bytes(REQUEST_BYTES)
        t.admit(1)
        keep.append(t)
    t0 = time.perf_counter()
    for _ in range(n):
        deadline = loop.time() + 60.0
        if admission.refusal(attempts=0, deadline=deadline) is not None:
            raise SystemExit("admission refused a call with room to spare: not a cost bench")
        with await admission.arrive(attempts=0, deadline=deadline) as ticket:
            ticket.add_bytes(REQUEST_BYTES)
            ticket.admit(1)
    took = time.perf_counter() - t0
    for t in keep:
        t.release()
    return took / n


def _span(xs: list[float]) -> str:
    return f"{statistics.median(xs):6.2f} [{min(xs):.2f}-{max(xs):.2f}]"


async def main(args: argparse.Namespace) -> None:
    def make(name: str) -> Admission:
        if name == "off":
            return Admission.off()
        return Admission.from_settings(AdmissionSettings(),
                                       engine_batch_items=DEFAULT_ENGINE_BATCH_ITEMS)

    variants = ("default", "off")
    us: dict[tuple[str, int], list[float]] = {(v, h): [] for v in variants for h in (0, args.held)}
    diff: dict[int, list[float]] = {0: [], args.held: []}
    for r in range(args.rounds):
        order = variants if r % 2 == 0 else variants[::-1]
        for held in (0, args.held):
            got = {}
            for v in order:
                got[v] = await _calls(make(v), args.calls, held) * 1e6
                us[(v, held)].append(got[v])
            diff[held].append(got["default"] - got["off"])
        print(f"  round {r + 1}: " + ", ".join(
            f"{v} held {h}: {us[(v, h)][-1]:.2f} us" for h in (0, args.held) for v in variants),
            flush=True)
    print(f"\n{args.calls:,} calls per round, {args.rounds} rounds (median [range]), "
          "microseconds per call:\n")
    print("| calls held meanwhile | default admission | admission off | default - off |")
    print("|---|---|---|---|")
    for held in (0, args.held):
        print(f"| {held:,} | {_span(us[('default', held)])} | {_span(us[('off', held)])} | "
              f"{_span(diff[held])} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--held", type=int, default=1024)
    asyncio.run(main(ap.parse_args()))
