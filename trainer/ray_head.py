"""A local Ray head started from this Python's environment, for ``ray job submit`` (stdlib only).

``make demo`` and the end-to-end tests use it the way the README tells users to run a cluster on
one machine: ``ray start --head`` from a shell whose PATH begins with the project's ``.venv/bin``
(a job's entrypoint runs the ``python`` of the PATH the head was started with), token auth on
(``RAY_AUTH_MODE=token``, Ray 2.60's default for clusters it starts; the token is
``~/.ray/auth_token``, or ``$RAY_AUTH_TOKEN`` / ``$RAY_AUTH_TOKEN_PATH``), the dashboard (job
API) bound to 127.0.0.1, every port chosen free, and its own temp dir so that it never becomes
another process's ``address="auto"``. ``ray stop`` would stop every Ray on the machine: stop it
with :meth:`LocalRayHead.stop` (it ends the ``ray start --block`` process, which stops the rest).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

PORT_FLAGS = ("--port", "--dashboard-port", "--ray-client-server-port",
              "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
              "--runtime-env-agent-port", "--metrics-export-port", "--node-manager-port",
              "--object-manager-port")


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on every interface right now (Ray binds 0.0.0.0)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def project_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment, with this Python's bin dir first on PATH and Ray token auth on."""
    bin_dir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{path}", "RAY_AUTH_MODE": "token",
           "PYTHONUNBUFFERED": "1"}
    env.update(extra or {})
    return env


class _EarlyExit(Exception):
    """``ray start`` exited before the head was up (typically: a port got taken)."""


class LocalRayHead:
    """``ray start --head --block`` on this machine; ``address`` (GCS) and ``dashboard_url``
    (for ``ray job submit --address``) once started."""

    def __init__(self, *, num_cpus: int, env: Mapping[str, str] | None = None,
                 log_path: Path | None = None) -> None:
        self.num_cpus = num_cpus
        self.env = project_env(env)
        self.temp_dir = Path(tempfile.mkdtemp(prefix="rh_", dir="/tmp"))  # short: unix socket paths
        self.log_path = log_path or self.temp_dir / "head.log"
        self.ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS)), strict=True))
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def ray(self) -> str:
        return str(Path(sys.executable).parent / "ray")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.ports['--port']}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['--dashboard-port']}"

    def start(self, timeout_s: float = 120.0, *, tries: int = 3) -> LocalRayHead:
        """Start it; a port taken between choosing and binding (``ray start`` exits at once)
        gets new ports, up to ``tries`` times."""
        for attempt in range(1, tries + 1):
            try:
                return self._start_once(timeout_s)
            except _EarlyExit:
                self.ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS)), strict=True))
                if attempt == tries:
                    self.stop()
                    raise RuntimeError(f"ray start failed {tries} times; see {self.log_path}") from None
        raise AssertionError("unreachable")

    def _start_once(self, timeout_s: float) -> LocalRayHead:
        cmd = [self.ray, "start", "--head", "--block", "--disable-usage-stats",
               f"--num-cpus={self.num_cpus}", "--include-dashboard=true",
               "--dashboard-host=127.0.0.1", f"--temp-dir={self.temp_dir}",
               *(f"{flag}={port}" for flag, port in self.ports.items())]
        log = self.log_path.open("wb")
        self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                      start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self._proc = None
                raise _EarlyExit
            if self._dashboard_up():
                return self
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"Ray head not up within {timeout_s:.0f}s; see {self.log_path}")

    def _dashboard_up(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.dashboard_url}/api/version", timeout=2):
                return True
        except OSError as e:  # 401 (token auth) also means it is up
            return getattr(e, "code", None) == 401

    def submit_command(self, entrypoint: Sequence[str], *, working_dir: Path,
                       runtime_env_json: str | None = None) -> list[str]:
        """``ray job submit`` as the README writes it (it follows the job's logs to the end)."""
        cmd = [self.ray, "job", "submit", "--address", self.dashboard_url,
               "--working-dir", str(working_dir)]
        if runtime_env_json:
            cmd += ["--runtime-env-json", runtime_env_json]
        return [*cmd, "--", *entrypoint]

    def submit(self, entrypoint: Sequence[str], *, working_dir: Path, timeout_s: float,
               runtime_env_json: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.submit_command(entrypoint, working_dir=working_dir, runtime_env_json=runtime_env_json),
            cwd=working_dir, env=self.env, capture_output=True, text=True, timeout=timeout_s,
        )

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGTERM to ``ray start --block``: it stops the Ray processes it started (~2 s; the
        same signal to the whole group at once takes it a minute). SIGKILL to the group if not."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> LocalRayHead:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
