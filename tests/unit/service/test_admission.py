"""Admission control counts work, refuses what does not fit at once with a retry hint, and
lets a request bigger than the limit run alone."""

from __future__ import annotations

import pytest

from reward_server.errors import Overloaded
from reward_server.service import Admission, AdmissionSettings, admission_for


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
    a = admission_for(AdmissionSettings(batches_in_flight=4), engine_batch_items=300)
    assert a.max_judgments == 1200
    assert admission_for(AdmissionSettings(max_judgments_in_flight=7), engine_batch_items=300).max_judgments == 7
    off = admission_for(AdmissionSettings(enabled=False), engine_batch_items=300)
    t = off.enter()
    t.add_bytes(10**9)
    t.admit(10**9)  # never refuses


def test_a_large_body_holds_its_estimated_judgments_before_it_is_parsed() -> None:
    """Admitted calls average 10 bytes per judgment; a 700-byte body then holds ~70 judgments
    as soon as it is read, so a second one is refused before anyone parses it."""
    a = Admission(max_judgments=100, max_bytes=None, seed=0)
    t = a.enter()
    t.add_bytes(20)
    t.admit(2)  # 10 bytes per judgment
    t.release()
    big = a.enter()
    big.add_bytes(700)
    assert big.judgments == 70
    other = a.enter()
    with pytest.raises(Overloaded, match="70 judgments in flight"):
        other.add_bytes(700)
    big.release()
    assert a.judgments == 0
