"""Admission control counts work, refuses what does not fit at once with a retry hint, and
lets a request bigger than the limit run alone."""

from __future__ import annotations

import pytest

from reward_server.admission import Admission, AdmissionSettings
from reward_server.errors import Overloaded
from reward_server.service import admission_for


def test_work_that_fits_is_admitted_and_the_rest_refused_with_a_hint() -> None:
    a = Admission(max_judgments=100, max_bytes=10_000, seed=0)
    t1 = a.enter(10)
    t1.admit(60)
    t2 = a.enter(10)
    with pytest.raises(Overloaded, match="60 judgments in flight and this call needs 50") as e:
        t2.admit(50)
    assert e.value.retry_after_s is not None and 0.025 <= e.value.retry_after_s <= 7.5
    t2.admit(40)  # exactly fills the limit
    with pytest.raises(Overloaded, match="max_judgments_in_flight=100"):
        a.check_room()  # full: refused before reading anything
    t1.release()
    t2.release()
    assert (a.judgments, a.bytes, a.refused) == (0, 0, 2)
    a.check_room()


def test_a_request_larger_than_the_limit_runs_alone() -> None:
    a = Admission(max_judgments=10, max_bytes=100)
    with a.enter(500) as t:  # bigger than the byte limit, nothing else in flight
        t.admit(1000)
        with pytest.raises(Overloaded, match="request bytes"):
            a.enter(1)
    assert (a.judgments, a.bytes) == (0, 0)


def test_bytes_are_held_until_release() -> None:
    a = Admission(max_judgments=None, max_bytes=100)
    t = a.enter(80)
    with pytest.raises(Overloaded, match="80 request bytes in flight and this call has 30"):
        a.enter(30)
    t.release()
    t.release()  # idempotent
    a.enter(30).release()
    assert a.bytes == 0


def test_settings_size_the_default_from_the_engines() -> None:
    a = admission_for(AdmissionSettings(batches_in_flight=4), engine_batch_items=300)
    assert a.max_judgments == 1200
    assert admission_for(AdmissionSettings(max_judgments_in_flight=7), engine_batch_items=300).max_judgments == 7
    off = admission_for(AdmissionSettings(enabled=False), engine_batch_items=300)
    off.enter(10**9).admit(10**9)  # never refuses
