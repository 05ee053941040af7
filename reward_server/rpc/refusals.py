"""The log of calls refused for load: one line when refusals start, then one line a window.

Under overload the server refuses calls by the thousand a second (RESOURCE_EXHAUSTED with a
pushback, which the clients wait out and retry). A log line per refusal floods the log and
costs the server CPU it needs then: measured with ``python bench/refusal_cost.py`` (one
run each), a refused call cost 0.745 ms of server CPU with a line each and 0.670 ms with
logging at WARNING (0.635 and 0.580 ms with 16 calls at once). So each refusal is logged at
DEBUG; at INFO the first refusal after a quiet window is logged as before, and the next ones
are counted and summed up in one line when a refusal comes ``every_s`` or more after the last
line. ``reward_server_rpc_calls_total{code="RESOURCE_EXHAUSTED"}`` (docs/metrics.md) counts every
one of them (admission's, and a Ray deployment's full queue).
"""

from __future__ import annotations

import logging
import time

logger = logging.getLogger("reward_server.rpc.servicer")  # where the per-call lines have been

WINDOW_S = 10.0


class LoadRefusalLog:
    """Logs refusals for load as the module doc says (call from the event loop)."""

    def __init__(self, every_s: float = WINDOW_S) -> None:
        self._every_s = every_s
        self._last_line: float | None = None  # when the last INFO line was written
        self._counted = 0  # refusals since that line, not in a line yet
        self._latest = ""

    def refused(self, rpc: str, message: str) -> None:
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("%s -> RESOURCE_EXHAUSTED: %s", rpc, message)
        if not logger.isEnabledFor(logging.INFO):
            return
        now = time.monotonic()
        last = self._last_line
        if last is not None and now - last < self._every_s:
            self._counted += 1
            self._latest = f"{rpc}: {message}"
            return
        if last is not None and self._counted:
            logger.info("%d more calls refused for load in the last %.0f s (latest %s); "
                        "and now %s -> RESOURCE_EXHAUSTED: %s", self._counted, now - last,
                        self._latest, rpc, message)
        else:
            logger.info("%s -> RESOURCE_EXHAUSTED: %s (further refusals for load are summed "
                        "up every %g s; each at DEBUG)", rpc, message, self._every_s)
        self._last_line = now
        self._counted = 0
