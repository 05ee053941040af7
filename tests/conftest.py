"""Suite-wide fixtures. ``ray_session``: the ONE local Ray (2 CPUs) shared by every test that
needs Ray; started on first use, shut down at the end of the session. ``thread_server``: a real
reward server (fake engines) on 127.0.0.1 in a background thread, for callers that block (sync
trainers, Ray actors, subprocesses)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterator, Sequence
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


class ThreadServer:
    """A reward server built by the composition root, running on its own event loop thread."""

    def __init__(self, overrides: Sequence[str] = ()) -> None:
        from reward_server.backends.fake import FakeJudge, FakeNLI

        self.loop = asyncio.new_event_loop()
        self.judge = FakeJudge()
        self.nli = FakeNLI()
        self.port = 0
        self.overrides = list(overrides)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._start())
        except BaseException as e:  # reported by start()
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        from reward_server.app import start_app
        from reward_server.config import load_config

        config = load_config(overrides=[
            "server.port=0", "server.drain_delay_s=0",
            "engines={judge: {kind: fake}, nli: {kind: fake}}", *self.overrides,
        ], env={})
        self.app = await start_app(
            config, judge_factory=lambda _s: self.judge, nli_factory=lambda _s: self.nli
        )
        self.port = self.app.port

    def start(self) -> ThreadServer:
        self._thread.start()
        assert self._ready.wait(30), "reward server did not start"
        if self._error is not None:
            raise self._error
        return self

    def stop(self, grace: float = 1.0) -> None:
        if not self._thread.is_alive():
            return
        fut = asyncio.run_coroutine_threadsafe(self.app.stop(grace=grace, drain_delay=0), self.loop)
        fut.result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture
def thread_server() -> Iterator[Callable[..., ThreadServer]]:
    """Factory: ``thread_server(overrides=...)`` starts one; all are stopped after the test."""
    started: list[ThreadServer] = []

    def make(overrides: Sequence[str] = ()) -> ThreadServer:
        server = ThreadServer(overrides).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def reward_server() -> Iterator[ThreadServer]:
    """One fake-engine server in a thread for a whole test module."""
    server = ThreadServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    """The local SmolLM2-135M-Instruct folder (policy and tokenizer); skip when absent."""
    from reward_server.backends.smollm2 import local_smollm2_path
    from reward_server.errors import ModelLoadError

    try:
        return str(local_smollm2_path())
    except ModelLoadError as e:
        pytest.skip(f"no local SmolLM2: {e}")


@pytest.fixture
def exported() -> Iterator[Any]:
    """An OpenTelemetry in-memory exporter on the global SDK tracer provider (set up by the
    first test that needs one); tracing is turned off again afterwards. Skips without the SDK."""
    sdk = pytest.importorskip("opentelemetry.sdk.trace", reason="opentelemetry-sdk not installed")
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from reward_server import tracing

    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, sdk.TracerProvider):
        provider = sdk.TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    tracing.configure(enabled=False)
    exporter.shutdown()


def _listeners_of(pid: int) -> list[tuple[int, str, str, int]]:
    """Every TCP listener of ``pid`` and its descendants: (pid, process name, ip, port)."""
    import psutil

    root = psutil.Process(pid)
    procs = {p.pid: p for p in [root, *root.children(recursive=True)]}
    out = []
    for c in psutil.net_connections(kind="tcp"):
        if c.status == psutil.CONN_LISTEN and c.pid in procs:
            try:
                name = procs[c.pid].name()
            except psutil.Error:
                name = "?"
            out.append((c.pid, name, c.laddr.ip, c.laddr.port))
    return out


def is_loopback_ip(ip: str) -> bool:
    import ipaddress

    addr = ipaddress.ip_address(ip)
    mapped = getattr(addr, "ipv4_mapped", None)
    return bool((mapped or addr).is_loopback)


@pytest.fixture
def listeners_of() -> Callable[[int], list[tuple[int, str, str, int]]]:
    """``listeners_of(pid)``: the TCP listeners of a process tree (see :func:`_listeners_of`)."""
    return _listeners_of


@pytest.fixture
def loopback() -> Callable[[str], bool]:
    return is_loopback_ip
