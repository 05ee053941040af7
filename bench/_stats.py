"""Repetition, interleaving, spreads and CPU accounting shared by the benchmarks.

Every ratio a benchmark reports comes from runs interleaved in one script run (A, B, A, B, ...;
the order rotates each round, so a drift in the machine's load hits every variant alike) and is
given as the median and range over the rounds of the per-round ratio: :class:`Trials`.

CPU is counted in every process that does the work: :class:`ProcessTree` reads /proc for this
process and all its descendants (a local Ray started from here is: GCS, raylet, the Serve
controller and proxy, the replicas, Ray's agents), grouped by role from the command line; the
benchmark adds the CPU of child processes that exit before it can read them (its callers report
their own). :class:`MachineCpu` reads the whole machine's busy share (other jobs included), to show
how loaded the machine was.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HZ = os.sysconf("SC_CLK_TCK")


# ----------------------------------------------------------------------------- spreads
@dataclass(frozen=True)
class Spread:
    """Median and range of a list of numbers."""

    median: float
    lo: float
    hi: float
    n: int

    @classmethod
    def of(cls, xs: Sequence[float]) -> Spread:
        if not xs:
            return cls(float("nan"), float("nan"), float("nan"), 0)
        return cls(statistics.median(xs), min(xs), max(xs), len(xs))

    def fmt(self, digits: int = 2, unit: str = "") -> str:
        """``1.23x [1.10-1.40]`` style: the median, then the range over the runs."""
        f = f"{{:,.{digits}f}}"
        return f"{f.format(self.median)}{unit} [{f.format(self.lo)}-{f.format(self.hi)}]"


def rounds(names: Sequence[str], runs: int) -> Iterator[tuple[int, str]]:
    """(round, name) for ``runs`` rounds of every name, the order rotating one step a round
    (A B C, B C A, C A B, ...): interleaved, and no variant always first after a pause."""
    for r in range(runs):
        k = r % len(names)
        for name in [*names[k:], *names[:k]]:
            yield r, name


@dataclass
class Trials:
    """Rows (dicts of measures) per variant and round; spreads and per-round ratios."""

    rows: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)

    def add(self, name: str, run: int, row: dict[str, Any]) -> None:
        self.rows.setdefault(name, {})[run] = row

    def values(self, name: str, key: str) -> list[float]:
        return [float(r[key]) for _, r in sorted(self.rows.get(name, {}).items())]

    def spread(self, name: str, key: str) -> Spread:
        return Spread.of(self.values(name, key))

    def ratios(self, a: str, b: str, key: str) -> list[float]:
        """``a[key] / b[key]`` for every round both ran (the pairs of one round)."""
        ra, rb = self.rows.get(a, {}), self.rows.get(b, {})
        return [float(ra[k][key]) / float(rb[k][key]) for k in sorted(set(ra) & set(rb))
                if float(rb[k][key])]

    def ratio(self, a: str, b: str, key: str) -> Spread:
        return Spread.of(self.ratios(a, b, key))


# ----------------------------------------------------------------------------- CPU
def _stat(pid: int | str) -> tuple[int, float] | None:
    """(parent pid, CPU seconds: user + system, all threads) of ``pid``; None if it is gone."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(f[1]), (int(f[11]) + int(f[12])) / HZ


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def role(cmdline: str) -> str:
    """What a process of a local Ray (or this benchmark) does, from its command line."""
    if cmdline.startswith("ray::ServeReplica:"):  # ray::ServeReplica:<app>:<deployment>
        parts = cmdline.split()[0].split(":")
        return f"replica {parts[3] if len(parts) > 3 else '?'}"
    if cmdline.startswith("ray::ServeController"):
        return "Serve controller"
    if cmdline.startswith("ray::ProxyActor"):
        return "Serve proxy"
    if cmdline.startswith(("ray::DashboardAgent", "ray::RuntimeEnvAgent")):
        return "Ray's own processes"
    if cmdline.startswith("ray::"):
        return "Ray workers (other)"
    for name in ("gcs_server", "raylet", "dashboard", "log_monitor", "runtime_env", "monitor.py",
                 "agent", "ray_client_server"):
        if name in cmdline:
            return "Ray's own processes"
    return "other children"


class ProcessTree:
    """CPU seconds of a process and all its descendants, by role (see :func:`role`)."""

    def __init__(self, root: int | None = None, *, root_role: str = "this process") -> None:
        self.root = root or os.getpid()
        self.root_role = root_role
        self.names: dict[int, str] = {}  # roles given by the benchmark (its callers, ingresses)

    def name(self, pid: int, role_name: str) -> None:
        self.names[pid] = role_name

    def snapshot(self) -> dict[int, tuple[str, float]]:
        parents: dict[int, int] = {}
        cpu: dict[int, float] = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                s = _stat(entry.name)
                if s is not None:
                    parents[int(entry.name)], cpu[int(entry.name)] = s
        out: dict[int, tuple[str, float]] = {}
        for pid, seconds in cpu.items():
            p, depth = pid, 0
            while p not in (self.root, 0, 1) and depth < 64:
                p, depth = parents.get(p, 0), depth + 1
            if p != self.root:
                continue
            if pid == self.root:
                name = self.root_role
            else:
                name = self.names.get(pid) or role(_cmdline(pid))
            out[pid] = (name, seconds)
        return out

    @staticmethod
    def delta(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
        """CPU seconds by role between two snapshots (a process started in between counts all
        its CPU; one that exited in between is lost: count it yourself)."""
        out: dict[str, float] = {}
        for pid, (name, seconds) in after.items():
            out[name] = out.get(name, 0.0) + seconds - before.get(pid, (name, 0.0))[1]
        return out


class MachineCpu:
    """The whole machine's busy CPU (every process, other jobs included), from /proc/stat."""

    @staticmethod
    def snapshot() -> tuple[float, float]:
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = f[3] + f[4]  # idle + iowait
        return (sum(f) - idle) / HZ, time.perf_counter()

    @staticmethod
    def cores_busy(before: tuple[float, float], after: tuple[float, float]) -> float:
        return (after[0] - before[0]) / max(1e-9, after[1] - before[1])


# ----------------------------------------------------------------------------- the run's facts
def machine_line() -> str:
    """The machine, the date, the commit and the load at the start: a results table's footer."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parent, check=False).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "bench", "reward_server"],
                               capture_output=True, text=True, check=False,
                               cwd=Path(__file__).resolve().parent).stdout.strip()
    except OSError:
        commit, dirty = "?", ""
    load = os.getloadavg()[0]
    return (f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs ({model or platform.machine()}), "
            f"commit {commit}{' + local changes' if dirty else ''}, load average {load:.2f} at the start")
