"""Admission control counts work, lets a call that does not fit wait in line while its deadline
allows (else refuses it at once with a retry hint), and lets a request bigger than the limit run
alone."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import pytest

from reward_server.errors import Overloaded
from reward_server.service import Admission, AdmissionSettings, admission_for
from reward_server.service._limiter import RetryLine
from reward_server.service.admission import RETRIES_PER_COMPLETED


def test_work_that_fits_is_admitted_and_the_rest_refused_with_a_hint() -> None:
    a = Admission(max_judgments=100, max_bytes=10_000, seed=0)
    t1 = a.enter()
    t1.add_bytes(10)
    t1.admit(50)
    t2 = a.enter()  # nothing held until its request arrives ...
    assert t2.judgments == 0
    t2.add_bytes(10)  # ... then a usual call (50 now), provisionally, until its own are known
    assert t2.judgments == 50
    with pytest.raises(Overloaded, match="50 judgments in flight and this call needs 60") as e:
        t2.admit(60)
    assert e.value.retry_after_s is not None and 0.025 <= e.value.retry_after_s <= 7.5
    t2.admit(50)  # exactly fills the limit
    with pytest.raises(Overloaded, match="max_judgments_in_flight=100"):
        a.enter()  # full: refused before reading anything
    t1.release()
    t2.release()
    assert (a.judgments, a.bytes, a.refused) == (0, 0, 2)
    a.enter().release()


def test_arrivals_see_each_others_provisional_holds() -> None:
    a = Admission(max_judgments=100, max_bytes=None)
    with a.enter() as first:
        first.admit(40)  # calls are usually 40 judgments
    held = [a.enter(), a.enter()]
    for t in held:
        t.add_bytes(1)  # 40 + 40 held, nothing parsed yet
    with pytest.raises(Overloaded, match="80 judgments in flight"):
        a.enter()  # a third would not fit: refused without reading its request
    for t in held:
        t.admit(40)
        t.release()
    assert a.judgments == 0


def test_calls_waiting_for_their_request_hold_nothing() -> None:
    a = Admission(max_judgments=100, max_bytes=100)
    with a.enter() as first:
        first.add_bytes(10)
        first.admit(40)
    waiting = [a.enter() for _ in range(10)]  # half-open: their requests never arrive
    assert (a.judgments, a.bytes) == (0, 0)
    with a.enter() as t:  # a real call still gets in
        t.add_bytes(10)
        t.admit(40)
    for w in waiting:
        w.release()
    assert (a.judgments, a.bytes) == (0, 0)


def test_a_request_larger_than_the_limit_runs_alone() -> None:
    a = Admission(max_judgments=10, max_bytes=100)
    with a.enter() as t:  # nothing else in flight
        t.add_bytes(500)
        t.admit(1000)
        with pytest.raises(Overloaded, match="1000 judgments in flight"):
            a.enter()
    assert (a.judgments, a.bytes) == (0, 0)


def test_bytes_are_held_until_release() -> None:
    a = Admission(max_judgments=None, max_bytes=100)
    t = a.enter()
    t.add_bytes(80)
    other = a.enter()
    with pytest.raises(Overloaded, match="80 request bytes in flight and this call has 30"):
        other.add_bytes(30)
    other.release()
    t.release()
    t.release()  # idempotent
    with a.enter() as again:
        again.add_bytes(30)
    assert a.bytes == 0


def test_settings_size_the_default_from_the_engines() -> None:
    default = admission_for(AdmissionSettings(batches_in_flight=4), engine_batch_items=300)
    assert not default.adaptive and (default.max_judgments, default.max_calls) == (1200, 4096)
    a = admission_for(AdmissionSettings(batches_in_flight=4, adaptive=True),
                      engine_batch_items=300)
    assert (a.cap_judgments, a.min_judgments) == (1200, 300)  # caps: 4 batches; floor: one
    assert a.adaptive and a.max_judgments == 300  # nothing measured yet: the floor
    floor = admission_for(AdmissionSettings(min_judgments_in_flight=300, adaptive=True),
                          engine_batch_items=300)
    assert floor.max_judgments == 300
    fixed = admission_for(AdmissionSettings(max_judgments_in_flight=7, adaptive=False),
                          engine_batch_items=300)
    assert (fixed.max_judgments, fixed.max_calls) == (7, 4096)
    off = admission_for(AdmissionSettings(enabled=False), engine_batch_items=300)
    t = off.enter()
    t.add_bytes(10**9)
    t.admit(10**9)  # never refuses


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _load(a: Admission, clock: Clock, *, offered: int, seconds: float,
          took_s: Callable[[int], float], judgments: int = 100, nli: int = 0) -> list[int]:
    """Rounds of ``offered`` calls of ``judgments`` each (``nli`` of them NLI pairs); the
    admitted ``n`` take ``took_s(n)``. Returns how many were admitted per round."""
    end, admitted = clock.now + seconds, []
    while clock.now < end:
        tickets = []
        for _ in range(offered):
            try:
                t = a.enter()
                t.add_bytes(100)
                t.admit(judgments, nli=nli)
            except Overloaded:
                continue
            tickets.append(t)
        clock.now += took_s(len(tickets))
        for t in tickets:
            t.release()
        admitted.append(len(tickets))
    return admitted


def batching(n: int) -> float:
    """An engine that answers up to 4 calls at once in 10 ms, more in proportion."""
    return 0.01 * max(1.0, n / 4)


def test_the_adaptive_limit_follows_measured_throughput_and_the_latency_target() -> None:
    """No target set: twice a lone call's latency (20 ms). Under load the limit grows while
    the latency stays under the target, and settles where Little's law puts it: the measured
    throughput times the target over P99_OVER_MEAN (about 5 calls of 100 judgments here)."""
    clock = Clock()
    a = Admission(max_judgments=10_000, max_bytes=None, max_calls=1000, adaptive=True,
                  min_judgments=100, min_calls=2, clock=clock, seed=0)
    assert (a.max_judgments, a.max_calls) == (100, 2)  # the floors until something is measured
    _load(a, clock, offered=1, seconds=1.0, took_s=batching)
    assert a.alone_s == pytest.approx(0.01)
    assert a.target() == pytest.approx(0.02)
    assert a.judgments_per_s == pytest.approx(100 / 0.01, rel=0.01)
    assert a.max_judgments == 100  # one call at a time never reached more: not grown
    admitted = _load(a, clock, offered=40, seconds=10.0, took_s=batching)
    assert 4 <= sum(admitted[-50:]) / 50 <= 6.5  # ~5.3 calls: 1.5 x 13 ms mean = the target
    assert 400 <= a.max_judgments <= 700
    assert a.max_calls >= 5  # calls did not bind: judgments did
    # with a target of 20 ms (target_p99_s) and an engine 10x slower, the limit shrinks to
    # the floor, never under it (with the measured target, the target follows the engine)
    a.target_s = 0.02
    _load(a, clock, offered=40, seconds=5.0, took_s=lambda n: 10 * batching(n))
    assert a.max_judgments == 100


def test_the_target_follows_the_latency_alone_of_calls_of_the_usual_size() -> None:
    """Calls of another size measured alone in between (1-item calls, 1 ms) do not set the
    target for the usual calls once they are back (128 judgments, 10 ms alone, now in pairs,
    never alone): twice 10 ms, not twice 1 ms."""
    clock = Clock()
    a = Admission(max_judgments=10_000, max_bytes=None, max_calls=1000, adaptive=True,
                  min_judgments=256, min_calls=2, clock=clock, seed=0)
    _load(a, clock, offered=1, seconds=0.5, took_s=lambda n: 0.01, judgments=128)
    assert a.target() == pytest.approx(0.02)
    _load(a, clock, offered=1, seconds=0.2, took_s=lambda n: 0.001, judgments=1)
    assert a.target() == pytest.approx(0.002)  # 1-item calls are the usual ones now
    _load(a, clock, offered=2, seconds=0.5, took_s=lambda n: 0.012, judgments=128)
    assert a.alone_s == pytest.approx(0.01)
    assert a.target() == pytest.approx(0.02)


class LoopCPU:
    """The event loop's CPU clock: ``share`` of the wall time passing on ``clock``."""

    def __init__(self, clock: Clock) -> None:
        self._clock, self._base, self._since, self.share = clock, 0.0, clock.now, 0.0

    def set(self, share: float) -> None:
        self._base, self._since, self.share = self(), self._clock.now, share

    def __call__(self) -> float:
        return self._base + (self._clock.now - self._since) * self.share


def test_shedding_holds_while_calls_are_refused_and_the_loop_stays_busy() -> None:
    """Saturated and refusing: under the floor. Shedding lowers the loop's load; between
    SHED_RELEASE and SATURATED, still refusing, the limit stays under the floor (it used to go
    back to it at once and flap); under SHED_RELEASE it is back at the floor."""
    clock = Clock()
    cpu = LoopCPU(clock)
    a = Admission(max_judgments=10_000, max_bytes=None, max_calls=1000, adaptive=True,
                  min_judgments=400, min_calls=2, clock=clock, cpu_clock=cpu, seed=0)
    _load(a, clock, offered=1, seconds=1.0, took_s=lambda n: 0.01)  # 10 ms alone
    ingress_bound = lambda n: 0.01 * n  # noqa: E731 - calls share one busy loop
    cpu.set(0.95)
    _load(a, clock, offered=20, seconds=2.0, took_s=ingress_bound)
    assert a.max_judgments < 400
    cpu.set(0.75)
    _load(a, clock, offered=20, seconds=2.0, took_s=ingress_bound)
    assert a.max_judgments < 400
    cpu.set(0.3)
    _load(a, clock, offered=20, seconds=2.0, took_s=ingress_bound)
    assert a.max_judgments == 400


def test_a_latency_target_and_the_caps_bound_the_limit() -> None:
    clock = Clock()
    a = Admission(max_judgments=1000, max_bytes=None, max_calls=10, adaptive=True,
                  min_judgments=1, min_calls=1, target_s=10.0, clock=clock)
    _load(a, clock, offered=100, seconds=10.0, took_s=batching)
    assert (a.max_judgments, a.max_calls) == (1000, 10)  # within 10 s any limit is fine: caps


def test_calls_are_counted_info_too() -> None:
    a = Admission(max_judgments=1000, max_bytes=None, max_calls=2, seed=0)
    score = a.enter()
    score.add_bytes(10)
    score.admit(10)
    info = a.enter(judged=False)
    info.add_bytes(5)  # holds a call and its bytes, no judgments
    assert (a.calls, a.judgments) == (2, 10)
    with pytest.raises(Overloaded, match="2 calls in flight, limit 2"):
        a.enter(judged=False)
    info.release()
    score.release()
    assert (a.calls, a.judgments, a.bytes) == (0, 0, 0)


async def _waiter(a: Admission, attempts: int, order: list[int]) -> None:
    with await a.arrive(attempts=attempts) as t:
        order.append(attempts)
        t.add_bytes(1)
        t.admit(100)
        await asyncio.sleep(0)


async def test_calls_that_do_not_fit_wait_in_line_retried_ones_first() -> None:
    a = Admission(max_judgments=100, max_bytes=None, max_wait_s=None, max_waiting=3, seed=0)
    first = await a.arrive()
    first.add_bytes(1)
    first.admit(100)  # full
    order: list[int] = []
    waiting = [asyncio.create_task(_waiter(a, n, order)) for n in (0, 3, 2)]
    await asyncio.sleep(0.01)
    assert a.waiting == 3 and not any(w.done() for w in waiting)
    late = asyncio.create_task(_waiter(a, 0, order))  # line full, no more attempts than any
    await asyncio.sleep(0.01)
    assert late.done() and isinstance(late.exception(), Overloaded)
    keen = asyncio.create_task(_waiter(a, 5, order))  # takes the place of the newest, fewest
    await asyncio.sleep(0.01)
    assert isinstance(waiting[0].exception(), Overloaded)
    first.release()
    await asyncio.gather(keen, waiting[1], waiting[2])
    assert order == [5, 3, 2]
    assert (a.calls, a.judgments, a.waiting) == (0, 0, 0)


async def test_without_a_line_a_call_that_does_not_fit_is_refused_at_once() -> None:
    a = Admission(max_judgments=100, max_bytes=None, max_wait_s=None, max_waiting=0, seed=0)
    with await a.arrive() as first:
        first.add_bytes(1)
        first.admit(100)
        with pytest.raises(Overloaded, match="100 judgments in flight") as e:
            await a.arrive(attempts=3)
        assert e.value.retry_after_s is not None and e.value.retry_after_s > 0


async def test_a_call_waits_while_its_deadline_allows_then_is_refused() -> None:
    """Nothing measured yet: no prediction, so the call waits, and is refused (not timed out)
    once its deadline no longer allows it to be served."""
    a = Admission(max_judgments=100, max_bytes=None, max_wait_s=None, max_waiting=8, seed=0)
    loop = asyncio.get_running_loop()
    with await a.arrive() as first:
        first.add_bytes(1)
        first.admit(100)
        t = loop.time()
        with pytest.raises(Overloaded, match="100 judgments in flight"):
            await a.arrive(deadline=t + 0.05)
        assert 0.04 < loop.time() - t < 1.0
        with pytest.raises(Overloaded, match="deadline"):
            await a.arrive(deadline=t)  # passed already: at once
    assert not a.waiting


async def test_a_call_is_refused_at_once_when_the_lines_predicted_wait_passes_its_deadline(
) -> None:
    """The engines complete 1,000 judgments a second (measured): behind 100 judgments over the
    limit a call of 100 would wait about 0.2 s, so a deadline of 50 ms is refused at once and
    one of 10 s waits, and is let in when room is freed."""
    clock = Clock()
    a = Admission(max_judgments=100, max_bytes=None, max_wait_s=None, max_waiting=8, seed=0,
                  clock=clock)
    _load(a, clock, offered=1, seconds=2.0, took_s=lambda n: 0.1)  # 100 judgments / 0.1 s
    assert a.judgments_per_s == pytest.approx(1000, rel=0.05)
    loop = asyncio.get_running_loop()
    first = a.enter()
    first.add_bytes(100)
    first.admit(100)  # full
    t = loop.time()
    with pytest.raises(Overloaded, match=r"predicted wait of 0\.\d s .*would pass this call's "
                       r"deadline") as e:
        await a.arrive(deadline=t + 0.05)
    assert loop.time() - t < 0.02 and e.value.retry_after_s is not None
    patient = asyncio.create_task(a.arrive(deadline=t + 10))
    await asyncio.sleep(0.01)
    assert a.waiting == 1 and not patient.done()
    first.release()
    (await patient).release()
    assert (a.judgments, a.calls, a.waiting) == (0, 0, 0)


async def test_a_call_waits_at_most_max_wait_s() -> None:
    a = Admission(max_judgments=100, max_bytes=None, max_wait_s=0.02, max_waiting=8, seed=0)
    with await a.arrive() as first:
        first.add_bytes(1)
        first.admit(100)
        with pytest.raises(Overloaded, match="100 judgments in flight"):
            await a.arrive(attempts=3)
    assert not a.waiting
    with await a.arrive():  # room again: at once
        pass


def test_a_large_body_holds_its_estimated_judgments_before_it_is_parsed() -> None:
    """Admitted calls average 10 bytes per judgment; a 700-byte body then holds ~70 judgments
    as soon as it is read, the next one the 30 left, so a third is refused before anyone
    parses it."""
    a = Admission(max_judgments=100, max_bytes=None, seed=0)
    t = a.enter()
    t.add_bytes(20)
    t.admit(2)  # 10 bytes per judgment
    t.release()
    big = a.enter()
    big.add_bytes(700)
    assert big.judgments == 70
    second = a.enter()
    second.add_bytes(700)
    assert second.judgments == 30  # the room left, not refused on an estimate
    with pytest.raises(Overloaded, match="100 judgments in flight"):
        a.enter()
    big.release()
    second.release()
    assert a.judgments == 0


def test_a_body_about_the_usual_size_holds_a_usual_call_not_its_estimate() -> None:
    """Bytes per judgment vary by a few per cent between calls of the same shape (ids and texts
    of other lengths). verl's merged calls of 128 judgments, estimated at 142 from their
    bodies: four of them still fill the limit of 512 exactly, where holding the estimate
    refused the fourth (and a refusal on a saturated loop sheds the limit)."""
    a = Admission(max_judgments=512, max_bytes=None, seed=0)
    with a.enter() as first:
        first.add_bytes(5120)
        first.admit(128)  # 40 bytes per judgment; usual 128
    held = []
    for _ in range(4):
        t = a.enter()
        t.add_bytes(5664)  # 44.25 bytes per judgment: estimated 142
        assert t.judgments == 128
        held.append(t)
    for t in held:
        t.admit(128)
    assert a.judgments == 512 and a.refused == 0
    for t in held:
        t.release()
    assert a.judgments == 0


def test_a_body_estimated_past_the_limit_still_enters_beside_a_small_call() -> None:
    """Bytes only estimate judgments: a call with a 20 KB id is one judgment. It enters beside
    a small call in flight (holding the room left until parsed) and is judged on what it is."""
    a = Admission(max_judgments=8, max_bytes=None, seed=0)
    t = a.enter()
    t.add_bytes(30)
    t.admit(1)  # 30 bytes per judgment; keep this one in flight
    big = a.enter()
    big.add_bytes(20_000)  # estimated ~667 judgments: more than the whole limit
    assert big.judgments == 7  # the room left beside the call in flight
    big.admit(1)
    assert a.judgments == 2
    big.release()
    t.release()
    assert a.judgments == 0


def test_a_huge_call_alone_does_not_set_the_latency_target() -> None:
    clock = Clock()
    a = Admission(max_judgments=10_000, max_bytes=None, adaptive=True, min_judgments=100,
                  clock=clock)
    _load(a, clock, offered=1, seconds=1.0, took_s=batching)
    assert a.target() == pytest.approx(0.02)
    _load(a, clock, offered=1, seconds=0.0, took_s=lambda n: 3.0, judgments=50_000)
    assert a.target() == pytest.approx(0.02)  # 3 s for 500 usual calls' work: not the usual


def test_a_saturated_event_loop_stops_the_growth_of_the_limit() -> None:
    """The same engine as above, but the thread serving the calls is busy all the time (its
    CPU clock runs with the wall clock): calls would queue in the transport, unseen by the
    latency measured from the handler, so the limit does not grow past Little's law."""
    clock = Clock()
    free = Admission(max_judgments=10_000, max_bytes=None, max_calls=1000, adaptive=True,
                     min_judgments=100, min_calls=2, clock=clock, cpu_clock=lambda: 0.0)
    busy = Admission(max_judgments=10_000, max_bytes=None, max_calls=1000, adaptive=True,
                     min_judgments=100, min_calls=2, clock=clock, cpu_clock=clock)
    for a in (free, busy):
        _load(a, clock, offered=1, seconds=1.0, took_s=batching)
        _load(a, clock, offered=40, seconds=10.0, took_s=batching)
    assert free.loop_busy == 0.0 and busy.loop_busy == pytest.approx(1.0)
    assert free.max_judgments >= 400  # grew while the latency allowed (as above)
    assert busy.max_judgments <= 200  # Little's law at the target: ~1.3 calls
    # calls of 1 ms alone are not shed so: a refusal would cost the loop what serving them does
    cheap = Admission(max_judgments=10_000, max_bytes=None, max_calls=1000, adaptive=True,
                      min_judgments=100, min_calls=2, clock=clock, cpu_clock=clock)
    _load(cheap, clock, offered=1, seconds=1.0, took_s=lambda n: batching(n) / 10)
    _load(cheap, clock, offered=40, seconds=10.0, took_s=lambda n: batching(n) / 10)
    assert cheap.loop_busy == pytest.approx(1.0) and cheap.max_judgments >= 400


class Cpu:
    """A thread CPU clock that runs with ``clock`` while ``busy`` (a saturated loop)."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self.busy, self.t, self.last = clock, True, 0.0, clock.now

    def __call__(self) -> float:
        if self.busy:
            self.t += self.clock.now - self.last
        self.last = self.clock.now
        return self.t


def test_an_overloaded_saturated_loop_sheds_under_the_floor_and_returns_to_it() -> None:
    """An ingress-bound server (its loop saturated, the engine's batches buy nothing: one call
    at a time takes 10 ms, n take n x 10 ms) refusing calls: the judgment limit goes under its
    floor (4 calls) to Little's law, about one call at a time; with the loop no longer
    saturated it is back at the floor in one window."""
    clock = Clock()
    cpu = Cpu(clock)
    a = Admission(max_judgments=10_000, max_bytes=None, max_calls=1000, adaptive=True,
                  min_judgments=400, min_calls=16, clock=clock, cpu_clock=cpu, seed=0)
    serial = lambda n: 0.01 * max(1, n)  # noqa: E731
    _load(a, clock, offered=1, seconds=1.0, took_s=serial)
    assert a.max_judgments == 400
    admitted = _load(a, clock, offered=8, seconds=5.0, took_s=serial)
    assert a.loop_busy == pytest.approx(1.0)
    assert 100 <= a.max_judgments < 200  # one call of 100 judgments at a time
    assert sum(admitted[-20:]) / 20 == 1
    cpu.busy = False  # the overload is over: the loop idles between calls
    _load(a, clock, offered=2, seconds=1.0, took_s=serial)
    assert a.max_judgments >= 400


def test_a_busy_loop_refusing_nothing_keeps_its_floor() -> None:
    """Saturated by the callers' own work (a test's client on the server's loop), but every
    call fits: the limit stays at its floor, so two concurrent calls are never refused."""
    clock = Clock()
    a = Admission(max_judgments=10_000, max_bytes=None, max_calls=1000, adaptive=True,
                  min_judgments=400, min_calls=16, clock=clock, cpu_clock=clock, seed=0)
    serial = lambda n: 0.01 * max(1, n)  # noqa: E731
    _load(a, clock, offered=1, seconds=1.0, took_s=serial)
    admitted = _load(a, clock, offered=2, seconds=5.0, took_s=serial)
    assert a.loop_busy == pytest.approx(1.0) and a.refused == 0
    assert a.max_judgments == 400 and set(admitted) == {2}


def test_refused_callers_are_spread_over_the_completions() -> None:
    """Each refused caller is told to come back after the ones refused before it, spaced by
    the completion rate (times RETRIES_PER_COMPLETED), not all after one call's duration."""
    clock = Clock()
    a = Admission(max_judgments=100, max_bytes=None, max_calls=1000, clock=clock, seed=0)
    _load(a, clock, offered=2, seconds=2.0, took_s=lambda n: 0.01)  # ~100 calls/s, refusals
    assert a.calls_per_s == pytest.approx(100, rel=0.05)
    clock.now += 10.0  # the callers refused meanwhile (told to come back in turn) are gone
    held = a.enter()
    held.add_bytes(1)
    held.admit(100)
    hints = []
    for _ in range(20):
        with pytest.raises(Overloaded) as e:
            a.enter()
        assert e.value.retry_after_s is not None
        hints.append(e.value.retry_after_s)
    spacing = 1 / (100 * RETRIES_PER_COMPLETED)
    assert hints[0] <= 0.075  # the first: about one call's duration (at least 50 ms, jittered)
    assert all(later - earlier == pytest.approx(spacing, rel=0.1)
               for earlier, later in itertools.pairwise(hints))
    assert hints[-1] >= 19 * spacing
    clock.now += 10.0  # the line empties with time: a refusal later is told one call again
    with pytest.raises(Overloaded) as e:
        a.enter()
    assert e.value.retry_after_s is not None and e.value.retry_after_s <= 0.075


def test_a_line_longer_than_the_longest_hint_is_spread_not_bunched() -> None:
    line = RetryLine(least_s=0.05, most_s=5.0)
    hints = [line.hint(100.0, least_s=0.05, per_s=10.0) for _ in range(200)]  # a 20 s line
    assert max(hints) <= 5.0 and hints[:49] == sorted(hints[:49])
    past = hints[50:]  # past 5 s: spread over 2.5-5 s, not all told 5 s
    assert min(past) >= 2.5 and len({round(h, 1) for h in past}) >= 20


def test_calls_refused_beside_a_call_larger_than_the_limit_do_not_grow_it() -> None:
    """Calls of 65,536 judgments run alone (each larger than any limit) while small calls
    beside them are refused: that says nothing about the limit (no size of it up to the cap
    would let them in beside such a call), so it does not grow, although the usual call's long
    latency alone makes any limit look fast enough."""
    clock = Clock()
    a = Admission(max_judgments=32_768, max_bytes=None, max_calls=4096, adaptive=True,
                  min_judgments=512, min_calls=16, clock=clock, seed=0)
    _load(a, clock, offered=1, seconds=1.0, took_s=lambda n: 0.005, judgments=128)
    end = clock.now + 5.0
    while clock.now < end:  # one large call at a time, two small ones refused beside each
        big = a.enter()
        big.add_bytes(100)
        big.admit(65_536)
        for _ in range(2):
            with pytest.raises(Overloaded):
                a.enter()
        clock.now += 0.3
        big.release()
    assert a.max_judgments == 512


def test_calls_kept_out_by_large_bodies_estimates_do_not_grow_the_limit() -> None:
    """Large bodies (52 MB, later refused or invalid) each hold the room left until parsed, so
    small calls beside them are refused: that says nothing about the limit (any larger limit
    would be taken by the next body's estimate as well), so it does not grow. Counted, it grew
    by a quarter a window (512 -> 1,000 here; bench/faults.py's overload after its large
    requests began at 8,363 and 12,041 judgments)."""
    clock = Clock()
    a = Admission(max_judgments=32_768, max_bytes=None, max_calls=4096, adaptive=True,
                  min_judgments=512, min_calls=16, clock=clock, seed=0)

    def small() -> None:
        with a.enter() as t:
            t.add_bytes(400)
            t.admit(16)
            clock.now += 0.005

    for _ in range(200):
        small()
    assert a.max_judgments == 512
    for _ in range(6):
        body = a.enter()
        body.add_bytes(52_000_000)
        assert body.judgments == a.max_judgments  # its estimate: the room left
        for _ in range(40):
            with pytest.raises(Overloaded):
                small()
            clock.now += 0.005
        body.release()  # never admitted (over the cap, or invalid)
        for _ in range(20):
            small()
    assert a.max_judgments == 512 and a.estimated == 0


def _grown(clock: Clock) -> Admission:
    """An adaptive admission (floors 100 judgments, 2 calls) grown under load: 40 calls
    offered to an engine that batches."""
    a = Admission(max_judgments=10_000, max_bytes=None, max_calls=1000, adaptive=True,
                  min_judgments=100, min_calls=2, clock=clock, seed=0)
    _load(a, clock, offered=1, seconds=1.0, took_s=batching)
    _load(a, clock, offered=40, seconds=10.0, took_s=batching)
    assert a.max_judgments >= 400
    return a


def test_a_limit_nobody_uses_comes_down_to_what_is_used() -> None:
    """Grown under load (40 calls offered, an engine that batches), the judgment limit comes
    down once one call at a time is all that comes: twice the most held at once, never under
    its floor; the call limit keeps what it grew to (per-sample callers come in bursts)."""
    clock = Clock()
    a = _grown(clock)
    calls = a.max_calls
    _load(a, clock, offered=1, seconds=1.5, took_s=batching, judgments=60)
    assert a.max_judgments == 120  # 2 x 60
    _load(a, clock, offered=1, seconds=1.5, took_s=batching, judgments=30)
    assert a.max_judgments == 100  # the floor
    assert a.max_calls >= calls


def test_the_throughput_restarts_when_the_calls_change_size() -> None:
    """Judgments per second depend on the calls' size (a large call spreads its fixed cost over
    more judgments): after calls of 65,536 judgments the rate of 128-judgment calls is their own
    from their first window, not a blend that keeps Little's law high for seconds."""
    clock = Clock()
    a = Admission(max_judgments=100_000, max_bytes=None, max_calls=4096, adaptive=True,
                  min_judgments=512, min_calls=16, clock=clock, seed=0)
    _load(a, clock, offered=1, seconds=2.0, took_s=lambda n: 0.5, judgments=65_536)
    assert a.judgments_per_s == pytest.approx(65_536 / 0.5, rel=0.01)
    _load(a, clock, offered=1, seconds=0.6, took_s=lambda n: 0.005, judgments=128)
    assert a.judgments_per_s == pytest.approx(128 / 0.005, rel=0.01)
    _load(a, clock, offered=1, seconds=0.6, took_s=lambda n: 0.004, judgments=128)
    assert 128 / 0.005 < a.judgments_per_s < 128 / 0.004  # the same size: blended


def test_an_idle_window_puts_a_grown_limit_back_at_its_floor() -> None:
    """A window with work in flight under a fifth of its time measures no throughput: the
    judgment limit grown under earlier load goes back to its floor (the next burst sizes it
    again), even if that window refused a call; the call limit keeps what it grew to."""
    clock = Clock()
    a = _grown(clock)
    grown, calls = a.max_judgments, a.max_calls
    clock.now += 2.0  # idle, but for a call refused: it did not fit beside another's
    holder = a.enter()
    holder.admit(grown)
    with pytest.raises(Overloaded):
        a.enter().admit(grown)
    holder.release()  # ends the window: held for no time in 2 s
    assert a.max_judgments == 100 and a.max_calls >= calls
    admitted = _load(a, clock, offered=40, seconds=2.0, took_s=batching)  # grows again
    assert a.max_judgments > 100 and max(admitted) > 1


def test_refused_callers_are_spaced_by_calls_of_the_usual_size_not_by_earlier_larger_ones() -> None:
    """After calls of 65,536 judgments (2 calls/s) and an idle while, calls of 128 come: the
    refused ones are spaced by the rate at which calls of 128 complete (the judgments per
    second over 128), not a second apart as the calls per second of the large ones would."""
    clock = Clock()
    a = Admission(max_judgments=100_000, max_bytes=None, max_calls=4096, adaptive=True,
                  min_judgments=512, min_calls=16, clock=clock, seed=0)
    _load(a, clock, offered=1, seconds=2.0, took_s=lambda n: 0.5, judgments=65_536)
    assert a.calls_per_s == pytest.approx(2, rel=0.01)
    clock.now += 3.0
    for _ in range(40):  # the usual call is now 128 judgments (measured on no busy window yet)
        t = a.enter()
        t.admit(128)
        t.release()
    assert a.calls_per_s == pytest.approx(2, rel=0.01)
    held = [a.enter() for _ in range(4)]
    for t in held:
        t.admit(128)
    hints = []
    for _ in range(8):
        with pytest.raises(Overloaded) as e:
            a.enter().admit(128)
        assert e.value.retry_after_s is not None
        hints.append(e.value.retry_after_s)
    assert a.judgments_per_s is not None
    per_s = a.judgments_per_s / 128 * RETRIES_PER_COMPLETED
    assert max(hints) - min(hints) == pytest.approx(7 / per_s, rel=0.2)
    assert max(hints) < 0.1  # a second apart, the eighth would be told 7 s


def test_a_few_very_large_calls_do_not_make_the_usual_call_large() -> None:
    """Three calls of 65,536 judgments among calls of 128, then a few of 4 (bench/faults.py's
    attack 3a and its victim): calls of 128 are still read four at a time under the floor of 512.
    A linear average of the sizes made the usual call thousands of judgments, so each arriving call
    was held as a whole floor's worth before it was read, and the second was refused unread."""
    clock = Clock()
    a = Admission(max_judgments=100_000, max_bytes=None, max_calls=4096, adaptive=True,
                  min_judgments=512, min_calls=16, clock=clock, seed=0)
    for size in [128] * 20 + [65_536] * 3 + [4] * 5:
        t = a.enter()
        t.admit(size)
        clock.now += 0.001
        t.release()
    assert a.max_judgments == 512
    held = []
    for _ in range(4):
        t = a.enter()  # not refused before its request is read
        t.add_bytes(6_000)
        held.append(t)
    for t in held:
        t.admit(128)
    assert a.judgments == 512 and a.refused == 0


def test_the_floor_is_one_full_batch_of_every_engine_the_calls_use() -> None:
    """A judge and an NLI engine of 256 items a batch: the judgment floor is their sum until
    calls are measured, one engine's batch while the calls use that engine only, the sum again
    for calls that use both (verl's merged calls: half judge prompts, half NLI pairs)."""
    clock = Clock()
    a = Admission(max_judgments=16_384, max_bytes=None, adaptive=True, min_judgments=512,
                  batches=(256, 256), clock=clock, cpu_clock=lambda: 0.0, seed=0)
    assert a.floor == 512 and a.max_judgments == 512
    _load(a, clock, offered=1, seconds=1.0, took_s=lambda n: 0.01, judgments=128)
    assert a.floor == 256  # judge prompts only
    _load(a, clock, offered=1, seconds=1.0, took_s=lambda n: 0.01, judgments=128, nli=128)
    assert a.floor == 256  # NLI pairs only
    _load(a, clock, offered=1, seconds=1.0, took_s=lambda n: 0.01, judgments=128, nli=64)
    assert a.floor == 512  # both engines, half and half
    _load(a, clock, offered=1, seconds=1.0, took_s=lambda n: 0.01, judgments=128, nli=1)
    assert a.floor == 512  # both engines, however few NLI pairs
    _load(a, clock, offered=1, seconds=1.0, took_s=lambda n: 0.01, judgments=128)
    assert a.floor == 256  # the window's calls decide: judge prompts only again


def test_calls_of_one_engine_are_not_admitted_two_batches_deep_under_overload() -> None:
    """Calls of 128 judge prompts whose latency grows with the work in flight (5 ms each, no
    gain from running together): with the floor counted as both engines' batches, 4 such calls
    ran at once (4x the latency alone); with the floor following the mix, 2 (one judge batch)."""
    def one_engine(floor_follows_the_mix: bool) -> tuple[list[int], int]:
        clock = Clock()
        a = Admission(max_judgments=16_384, max_bytes=None, max_calls=4096, adaptive=True,
                      min_judgments=512, min_calls=16,
                      batches=(256, 256) if floor_follows_the_mix else None, clock=clock,
                      cpu_clock=lambda: 0.0, seed=0)
        _load(a, clock, offered=1, seconds=1.0, took_s=lambda n: 0.005, judgments=128)
        admitted = _load(a, clock, offered=8, seconds=3.0, took_s=lambda n: 0.005 * n,
                         judgments=128)
        return admitted, a.max_judgments or 0

    admitted, limit = one_engine(True)
    assert limit == 256 and max(admitted[-50:]) == 2
    admitted, limit = one_engine(False)  # a configured floor stays the floor
    assert limit == 512 and max(admitted[-50:]) == 4

