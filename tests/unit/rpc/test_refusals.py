"""Refusals for load are logged once, then summed up a window at a time (each at DEBUG)."""

from __future__ import annotations

import logging
import time

import pytest

from reward_server.rpc.refusals import LoadRefusalLog

NAME = "reward_server.rpc.servicer"


def lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == NAME and r.levelno == level]


def test_a_burst_of_refusals_writes_one_line_then_one_summary_a_window(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = LoadRefusalLog(every_s=0.2)
    with caplog.at_level(logging.INFO, logger=NAME):
        for i in range(500):
            log.refused("Score", f"busy {i}")
        assert lines(caplog, logging.INFO) == [
            "Score -> RESOURCE_EXHAUSTED: busy 0 (further refusals for load are summed up "
            "every 0.2 s; each at DEBUG)"]
        time.sleep(0.25)
        log.refused("Info", "busy again")
    info = lines(caplog, logging.INFO)
    assert len(info) == 2
    assert info[1].startswith("499 more calls refused for load in the last ")
    assert "(latest Score: busy 499); and now Info -> RESOURCE_EXHAUSTED: busy again" in info[1]


def test_after_a_quiet_window_the_next_refusal_is_a_line_of_its_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = LoadRefusalLog(every_s=0.1)
    with caplog.at_level(logging.INFO, logger=NAME):
        log.refused("Score", "first")
        time.sleep(0.15)
        log.refused("Score", "second")
    info = lines(caplog, logging.INFO)
    assert len(info) == 2 and info[1].startswith("Score -> RESOURCE_EXHAUSTED: second")


def test_at_debug_every_refusal_has_its_line(caplog: pytest.LogCaptureFixture) -> None:
    log = LoadRefusalLog()
    with caplog.at_level(logging.DEBUG, logger=NAME):
        for i in range(5):
            log.refused("Score", f"busy {i}")
    assert lines(caplog, logging.DEBUG) == [f"Score -> RESOURCE_EXHAUSTED: busy {i}" for i in range(5)]
    assert len(lines(caplog, logging.INFO)) == 1
