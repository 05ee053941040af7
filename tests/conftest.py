"""Suite-wide fixtures. ``ray_session``: the ONE local Ray (2 CPUs) shared by every test that
needs Ray; started on first use, shut down at the end of the session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

# Serve pushes autoscaling metrics every 10 s by default; tests need seconds, not minutes.
# Read by Ray at import time, in this process and (inherited) in Ray's workers.
os.environ.setdefault("RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S", "0.5")
os.environ.setdefault("RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S", "0.5")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """A local Ray with Serve started (no HTTP proxy); yields the ``ray`` module."""
    import ray
    from ray import serve

    if not ray.is_initialized():
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            namespace="reward_server_tests",
            log_to_driver=False,
        )
    serve.start(proxy_location="Disabled")
    yield ray
    serve.shutdown()
    ray.shutdown()
