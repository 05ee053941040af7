"""A local Ray head started from this Python's environment, for ``ray job submit`` (stdlib only).

``make demo`` and the end-to-end tests use it the way the README tells users to run a cluster on
one machine: ``ray start --head`` from a shell whose PATH begins with the project's ``.venv/bin``
(a job's entrypoint runs the ``python`` of the PATH the head was started with), token auth on
(``RAY_AUTH_MODE=token``, Ray 2.60's default for clusters it starts), the node and the dashboard
(job API) on 127.0.0.1, every port chosen free, and its own temp dir so that it never becomes
another process's ``address="auto"``. ``ray stop`` would stop every Ray on the machine: stop it
with :meth:`LocalRayHead.stop` (it ends the ``ray start --block`` process, which stops the rest).

The token: the user's own where there is one (``$RAY_AUTH_TOKEN``, ``$RAY_AUTH_TOKEN_PATH``,
``~/.ray/auth_token``), used as it is, except that a file of the user's that others can read is
made 0600 first (``ray get-auth-token --generate`` writes ``~/.ray/auth_token`` 0644). Otherwise
the head makes one in its own temp dir (mode 0600, removed with the head; never printed or
logged) and :attr:`LocalRayHead.env` points ``RAY_AUTH_TOKEN_PATH`` at it, so everything
started with that environment (``ray job submit``, ``reward-server serve --address``, a second
node, the job's workers) carries it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
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
from typing import Self

logger = logging.getLogger(__name__)
NODE_PORT_FLAGS = ("--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                   "--runtime-env-agent-port", "--metrics-export-port", "--node-manager-port",
                   "--object-manager-port")
PORT_FLAGS = ("--port", "--dashboard-port", "--ray-client-server-port", *NODE_PORT_FLAGS)


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


def project_env(extra: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """This environment, with this Python's bin dir first on PATH and Ray token auth on;
    ``extra`` adds variables (a ``None`` value removes one)."""
    bin_dir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{path}", "RAY_AUTH_MODE": "token",
           "PYTHONUNBUFFERED": "1"}
    for key, value in (extra or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def has_user_token(env: Mapping[str, str]) -> bool:
    """Whether ``env`` gives Ray a token of the user's own: ``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH`` or ``$HOME/.ray/auth_token`` (where Ray 2.60 looks)."""
    if env.get("RAY_AUTH_TOKEN") or env.get("RAY_AUTH_TOKEN_PATH"):
        return True
    home = env.get("HOME")
    return home is not None and home != "" and (Path(home) / ".ray" / "auth_token").is_file()


def user_token_file(env: Mapping[str, str]) -> Path | None:
    """The token file of the user's that Ray reads for ``env`` (``RAY_AUTH_TOKEN_PATH``, else
    ``$HOME/.ray/auth_token``); None when the token is a value (``RAY_AUTH_TOKEN``) or no
    such file exists."""
    if env.get("RAY_AUTH_TOKEN"):
        return None
    named = env.get("RAY_AUTH_TOKEN_PATH")
    home = env.get("HOME")
    path = Path(named) if named else (Path(home) / ".ray" / "auth_token" if home else None)
    return path if path is not None and path.is_file() else None


def make_private(path: Path) -> bool:
    """Make a file of this user that others can read 0600; whether it did."""
    try:
        st = path.stat()
    except OSError:
        return False
    if st.st_uid != os.getuid() or not st.st_mode & 0o077:
        return False
    path.chmod(0o600)
    logger.warning("Ray token file %s was readable by other users; made it 0600", path)
    return True


def write_token(path: Path) -> Path:
    """A new random token (64 hex digits, as ``ray get-auth-token --generate`` makes) at
    ``path``, created with mode 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path


class _EarlyExit(Exception):
    """``ray start`` exited before the head was up; ``port_clash`` when a port got taken."""

    def __init__(self, reason: str, *, port_clash: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.port_clash = port_clash


_PORT_CLASH = re.compile(r"already (?:occupied|in use)|failed to bind|EADDRINUSE|address in use",
                         re.IGNORECASE)
_AUTH = re.compile(r"AuthenticationError|authentication token|auth_token", re.IGNORECASE)


def explain_exit(log: str, *, log_path: Path) -> _EarlyExit:
    """Why ``ray start`` exited early, from its log: one line with the fix."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    if any(_AUTH.search(ln) for ln in lines):
        return _EarlyExit(
            "ray start refused to start: token authentication is on (RAY_AUTH_MODE=token) but "
            "the token it was given cannot be read. Fix: point RAY_AUTH_TOKEN_PATH at a readable "
            "file holding the token, set RAY_AUTH_TOKEN, or unset both (and remove a broken "
            f"~/.ray/auth_token) to let the head make its own; log: {log_path}",
            port_clash=False)
    clash = next((ln for ln in lines if _PORT_CLASH.search(ln)), None)
    if clash is not None:
        return _EarlyExit(f"ray start could not bind a port ({clash[:200]}); log: {log_path}",
                          port_clash=True)
    errors = [ln for ln in lines if re.search(r"error|exception|failed", ln, re.IGNORECASE)]
    last = (errors or lines or ["(empty log)"])[-1]
    return _EarlyExit(f"ray start exited before the head was up: {last[:300]}. Fix what it "
                      f"names, or see the whole log: {log_path}", port_clash=False)


class _RayProcess:
    """``ray start ... --block`` run by this Python's ``ray``; a context manager."""

    @property
    def ray(self) -> str:
        return str(Path(sys.executable).parent / "ray")

    env: dict[str, str]
    log_path: Path

    def _launch(self, cmd: list[str]) -> subprocess.Popen[bytes]:
        """In its own session (a signal to the test runner's group does not reach it)."""
        log = self.log_path.open("wb")
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                start_new_session=True)

    def start(self, timeout_s: float = 120.0) -> Self:
        raise NotImplementedError

    def stop(self, timeout_s: float = 60.0) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class LocalRayHead(_RayProcess):
    """``ray start --head --block`` on this machine; ``address`` (GCS) and ``dashboard_url``
    (for ``ray job submit --address``) once started."""

    def __init__(self, *, num_cpus: int, env: Mapping[str, str | None] | None = None,
                 log_path: Path | None = None, node_ip: str = "127.0.0.1") -> None:
        self.num_cpus = num_cpus
        self.node_ip = node_ip
        self.env = project_env(env)
        self.temp_dir = Path(tempfile.mkdtemp(prefix="rh_", dir="/tmp"))  # short: unix socket paths
        self.log_path = log_path or self.temp_dir / "head.log"
        self.ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS)), strict=True))
        self._proc: subprocess.Popen[bytes] | None = None
        if node_ip in ("127.0.0.1", "::1", "localhost"):
            # Ray 2.60 replaces a loopback node address by the machine's unless this is 0
            # (then every listener stays on loopback; nodes from other machines cannot join).
            self.env.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        self.token_path: Path | None = None  # the head's own token, when the user has none
        if not has_user_token(self.env):
            self.token_path = write_token(self.temp_dir / "auth_token")
            self.env["RAY_AUTH_TOKEN_PATH"] = str(self.token_path)
        elif (users := user_token_file(self.env)) is not None:
            make_private(users)

    @property
    def auth_env(self) -> dict[str, str]:
        """What a process needs to talk to this head: token auth on and where the token is."""
        keys = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")
        return {k: self.env[k] for k in keys if k in self.env}

    def usage_line(self) -> str:
        """The one line a user pastes into another shell to use this head by hand (the token
        itself is never printed: only where it is)."""
        exports = " ".join(f"{k}={v}" for k, v in self.auth_env.items())
        return (f"export {exports} RAY_ADDRESS={self.dashboard_url}  # then: ray job submit -- ..., "
                f"ray status --address {self.address}")

    @property
    def address(self) -> str:
        return f"{self.node_ip}:{self.ports['--port']}"

    @property
    def dashboard_url(self) -> str:
        return f"http://{self.node_ip}:{self.ports['--dashboard-port']}"

    def start(self, timeout_s: float = 120.0, *, tries: int = 3) -> LocalRayHead:
        """Start it. Only a port taken between choosing and binding is retried (on new ports,
        up to ``tries`` times); any other early exit raises at once with its cause and fix."""
        for attempt in range(1, tries + 1):
            try:
                return self._start_once(timeout_s)
            except _EarlyExit as e:
                if not e.port_clash or attempt == tries:
                    self.stop()
                    raise RuntimeError(e.reason) from None
                self.ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS)), strict=True))
        raise AssertionError("unreachable")

    def command(self) -> list[str]:
        """The ``ray start --head`` command line this head runs."""
        return [self.ray, "start", "--head", "--block", "--disable-usage-stats",
                f"--num-cpus={self.num_cpus}", f"--node-ip-address={self.node_ip}",
                "--include-dashboard=true", f"--dashboard-host={self.node_ip}",
                f"--temp-dir={self.temp_dir}",
                *(f"{flag}={port}" for flag, port in self.ports.items())]

    def _start_once(self, timeout_s: float) -> LocalRayHead:
        self._proc = self._launch(self.command())
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self._proc = None
                raise explain_exit(self.log_path.read_text(errors="replace"), log_path=self.log_path)
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


def _descendants(pid: int) -> list[int]:
    """``pid``'s children, grandchildren, ... (from /proc; Linux)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


class LocalRayWorker(_RayProcess):
    """A second Ray node on this machine: ``ray start --address=<head> --block`` with its own
    temp dir (a driver picks this node with ``ray.init(address, _temp_dir=temp_dir)``), free
    ports, ``num_cpus`` and custom ``resources``. :meth:`kill` takes the node away abruptly
    (SIGKILL to its raylet, agents and workers at once), as a lost machine would."""

    def __init__(self, head_address: str, *, num_cpus: int, node_ip: str = "127.0.0.1",
                 resources: Mapping[str, float] | None = None,
                 env: Mapping[str, str | None] | None = None, log_path: Path | None = None) -> None:
        self.head_address = head_address
        self.num_cpus = num_cpus
        self.node_ip = node_ip
        self.resources = dict(resources or {})
        self.env = project_env({"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": None, **(env or {})})
        self.temp_dir = Path(tempfile.mkdtemp(prefix="rw_", dir="/tmp"))
        self.log_path = log_path or self.temp_dir / "worker.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 120.0) -> LocalRayWorker:
        """Start it and wait until ``ray start`` reports the node started."""
        ports = dict(zip(NODE_PORT_FLAGS, free_ports(len(NODE_PORT_FLAGS)), strict=True))
        cmd = [self.ray, "start", f"--address={self.head_address}", "--block",
               "--disable-usage-stats", f"--num-cpus={self.num_cpus}",
               f"--node-ip-address={self.node_ip}", f"--temp-dir={self.temp_dir}",
               f"--resources={json.dumps(self.resources)}",
               *(f"{flag}={port}" for flag, port in ports.items())]
        self._proc = self._launch(cmd)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self._proc = None
                raise RuntimeError(f"ray start --address exited; see {self.log_path}")
            if b"Ray runtime started" in self.log_path.read_bytes():
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"Ray worker node not up within {timeout_s:.0f}s; see {self.log_path}")

    def pids(self) -> list[int]:
        """``ray start`` and every process it started (raylet, agents, workers)."""
        if self._proc is None or self._proc.poll() is not None:
            return []
        return [self._proc.pid, *_descendants(self._proc.pid)]

    def _owns(self, pid: int) -> bool:
        try:
            return str(self.temp_dir) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return False

    def kill(self) -> list[int]:
        """SIGKILL the whole node at once; returns the pids it killed."""
        pids = self.pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self._proc is not None:
            self._proc.wait(10)
            self._proc = None
        return pids

    def stop(self, timeout_s: float = 60.0) -> None:
        """Leave gracefully (SIGTERM to ``ray start --block``); SIGKILL what is left after."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            rest = _descendants(proc.pid)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            for pid in rest:  # left behind (orphaned): only if still this node's process
                if self._owns(pid):
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
