"""Serve applications coming up, watched: a progress line per change, a failure in seconds.

Everything here is read from Serve's controller, not from log files: ``serve.status()`` and the
controller's instance details (the ``ServeInstanceDetails`` that the dashboard's
``/api/serve/applications/`` shows: per deployment its target replica count, the replicas and
their states, the resources one replica needs, the status message, and the replicas that died
recently with the path of their log). Serve puts a replica's own exception into its
deployment's message at the first failed start ("A replica failed to start with exception.
Retrying N more time(s). Error: <traceback>"), then retries it up to 3 times per replica,
each retry loading the model again (2 min 40 s for a model name that does not exist).

:func:`wait_apps_running` turns that into one line that names the deployment, the model, the
replica's exception and its log, raised as :class:`~reward_server.errors.BackendUnavailable`:

- ``fail_fast=True`` (an ingress that deploys the applications itself): at the first failed
  replica start; Serve's retries would fail the same way for a bad model name or a crash at
  start;
- ``fail_fast=False`` (an ingress attached to applications someone else deploys): when Serve
  gives up (DEPLOY_FAILED / UNHEALTHY); each failed start is logged as a warning meanwhile;
- ``placement="fail"`` (an embedded Ray: no autoscaler can add a node): at once when one
  replica needs more of a resource than the whole cluster has (a GPU on a CPU machine);
  ``"wait"`` (a cluster, which may autoscale): logged, then waited for until the timeout.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from reward_server.errors import BackendUnavailable

logger = logging.getLogger(__name__)

Details = Callable[[], Mapping[str, Any]]
_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure|Fault)\b.*")
_PID = re.compile(r"\bpid=(\d+)")
HEARTBEAT_S = 10.0


@dataclass(frozen=True)
class AppWatch:
    """One Serve application to wait for; ``model`` is what the user configured."""

    app: str
    model: str
    kind: str = "judge"  # the serving.ray.<kind> block that sizes its replicas


def replica_exception(error: str) -> str:
    """The replica's own exception, one line, from Serve's error text (a Ray traceback): the
    last line that names an exception, else the last non-empty line."""
    lines = [ln.strip() for ln in error.splitlines() if ln.strip()]
    named = [ln for ln in lines if _EXC_LINE.match(ln)]
    line = (named or lines or ["(no error text)"])[-1]
    return line[:500]


def _state(value: Any) -> str:
    """An enum member, its value or its name, as the bare upper-case name."""
    return str(getattr(value, "value", value)).rsplit(".", 1)[-1].upper()


def _logs_dir() -> str | None:
    """This node's Ray log directory (the replicas of a local Ray write under it)."""
    try:
        import ray._private.worker as ray_worker

        node = ray_worker._global_node
        return None if node is None else str(node.get_logs_dir_path())
    except Exception:  # a private detail of Ray: only the log path's prefix depends on it
        return None


def _replica_logs(dep: Mapping[str, Any], error: str) -> str:
    """Where the failed replica's output is: its Serve log and, when it is on this machine,
    its worker's stderr (``worker-*-<pid>.err``, the whole traceback)."""
    replicas = [*dep.get("recent_dead_replicas", []), *dep.get("replicas", [])]
    m = _PID.search(error)
    pid = int(m.group(1)) if m else None
    mine = [r for r in replicas if pid is not None and r.get("pid") == pid]
    replica = (mine or sorted(replicas, key=lambda r: r.get("start_time_s", 0.0)) or [None])[-1]
    logs = _logs_dir()
    parts: list[str] = []
    if replica is not None and replica.get("log_file_path"):
        rel = str(replica["log_file_path"]).lstrip("/")
        where = os.path.join(logs, rel) if logs else f"<ray logs dir>/{rel}"
        node = replica.get("node_ip")
        parts.append(f"{where}" + (f" on node {node}" if node else ""))
    pid = pid if pid is not None else (replica or {}).get("pid")
    if logs and pid is not None:
        parts += sorted(glob.glob(os.path.join(logs, f"worker-*-{pid}.err")))[-1:]
    return "; ".join(parts) or "see `ray logs` / the dashboard (no log path reported)"


def _shortfall(required: Mapping[str, Any], total: Mapping[str, float]) -> dict[str, str]:
    """Resources one replica needs beyond what the whole cluster has."""
    out: dict[str, str] = {}
    for name, need in required.items():
        if isinstance(need, int | float) and need > 0 and need > total.get(name, 0.0):
            out[name] = f"needs {need:g}, cluster has {total.get(name, 0.0):g}"
    return out


class _Watcher:
    def __init__(self, watches: Sequence[AppWatch], *, details: Details,
                 cluster_resources: Callable[[], Mapping[str, float]], fail_fast: bool,
                 placement: Literal["fail", "wait"]) -> None:
        self.watches = {w.app: w for w in watches}
        self.kinds = {w.app: w.kind for w in watches}
        self.details = details
        self.cluster_resources = cluster_resources
        self.fail_fast = fail_fast
        self.placement = placement
        self.shown: dict[str, tuple[str, float]] = {}
        self.warned: set[str] = set()
        self.last: dict[str, str] = {}

    def step(self, now: float, elapsed: float) -> bool:
        """One look at the applications; True when all are RUNNING. Raises on a failure."""
        apps = self.details()
        done = True
        for name, w in self.watches.items():
            app = apps.get(name)
            if app is None:
                self._say(name, f"Serve application {name} (model {w.model}): not created yet",
                          now, elapsed)
                done = False
                continue
            app_status = _state(app.get("status"))
            for dep_name, dep in (app.get("deployments") or {}).items():
                self._deployment(w, dep_name, dep, now, elapsed)
            if app_status == "DEPLOY_FAILED":
                raise BackendUnavailable(
                    f"Serve application {name} (model {w.model}) failed to deploy: "
                    f"{replica_exception(str(app.get('message', '')))}")
            done = done and app_status == "RUNNING"
        return done

    def _deployment(self, w: AppWatch, dep_name: str, dep: Mapping[str, Any], now: float,
                    elapsed: float) -> None:
        key = f"{w.app}/{dep_name}"
        status = _state(dep.get("status"))
        trigger = _state(dep.get("status_trigger", ""))
        message = str(dep.get("message") or "")
        replicas = dep.get("replicas") or []
        states: dict[str, int] = {}
        for r in replicas:
            states[_state(r.get("state"))] = states.get(_state(r.get("state")), 0) + 1
        up = states.get("RUNNING", 0)
        target = int(dep.get("target_num_replicas", len(replicas)))
        detail = ", ".join(f"{n} {s}" for s, n in sorted(states.items()) if s != "RUNNING")
        self._say(key, f"Serve deployment {key} (model {w.model}): {up} of {target} replicas up"
                  + (f" ({detail})" if detail else "") + f", {status.lower()}", now, elapsed)
        failed_start = message.startswith("A replica failed to start") or "failed to start" in message
        gave_up = status in ("DEPLOY_FAILED", "UNHEALTHY") or trigger.endswith("STARTUP_FAILED")
        if gave_up or (failed_start and self.fail_fast):
            error = message.split("Error:", 1)[-1]
            raise BackendUnavailable(
                f"Serve deployment {key} (model {w.model}) could not start a replica: "
                f"{replica_exception(error)} (replica log: {_replica_logs(dep, error)})")
        if failed_start and message != self.last.get(key):
            logger.warning("Serve deployment %s (model %s): a replica failed to start, Serve "
                           "retries it: %s", key, w.model, replica_exception(message))
        self.last[key] = message
        self._placement(w, key, dep, up, target, message)

    def _placement(self, w: AppWatch, key: str, dep: Mapping[str, Any], up: int, target: int,
                   message: str) -> None:
        if up >= target:
            return
        short = _shortfall(dep.get("required_resources") or {}, self.cluster_resources())
        if short and self.placement == "fail":
            needs = "; ".join(f"{k}: {v}" for k, v in sorted(short.items()))
            raise BackendUnavailable(
                f"Serve deployment {key} (model {w.model}) cannot be placed on this Ray: one "
                f"replica {needs}. Fix: lower serving.ray.{w.kind}.num_gpus / .num_cpus, or give "
                "the embedded Ray more (serving.ray.local_num_gpus / local_num_cpus), or join a "
                "cluster that has it (serving.ray.address)")
        if (short or "to be scheduled" in message) and key not in self.warned:
            self.warned.add(key)
            logger.warning("Serve deployment %s (model %s) waits for resources: %s", key, w.model,
                           message.strip() or f"one replica needs {short}")

    def _say(self, key: str, line: str, now: float, elapsed: float) -> None:
        before = self.shown.get(key)
        if before is None or before[0] != line or now - before[1] >= HEARTBEAT_S:
            self.shown[key] = (line, now)
            logger.info("%s [%.0fs]", line, elapsed)


def serve_details() -> Mapping[str, Any]:
    """The controller's per-application details (``ServeInstanceDetails.applications``)."""
    from ray.serve.context import _get_global_client

    from reward_server.serving._private.adapters import SERVE_STATUS_LOCK

    with SERVE_STATUS_LOCK:  # see SERVE_STATUS_LOCK: Serve's status calls are not thread-safe
        raw: Mapping[str, Any] = _get_global_client().get_serve_details()
    apps: Mapping[str, Any] = raw.get("applications") or {}
    return apps


def wait_apps_running(
    watches: Sequence[AppWatch],
    *,
    timeout_s: float,
    fail_fast: bool,
    placement: Literal["fail", "wait"],
    details: Details = serve_details,
    cluster_resources: Callable[[], Mapping[str, float]] | None = None,
    poll_s: float = 0.5,
) -> None:
    """Return once every application is RUNNING; :class:`BackendUnavailable` with the cause
    otherwise (see the module docstring), or after ``timeout_s`` with the last progress."""
    if cluster_resources is None:
        import ray

        cluster_resources = ray.cluster_resources
    watcher = _Watcher(watches, details=details, cluster_resources=cluster_resources,
                       fail_fast=fail_fast, placement=placement)
    start = time.monotonic()
    while True:
        now = time.monotonic()
        if watcher.step(now, now - start):
            for w in watches:
                logger.info("Serve application %s (model %s) is RUNNING [%.0fs]", w.app, w.model,
                            now - start)
            return
        if now - start >= timeout_s:
            last = "; ".join(line for line, _ in watcher.shown.values())
            hint = ("; deploy them (deploy/commands.sh serve-deploy, the RayService) or set "
                    "serving.ray.deploy=true" if "not created yet" in last else "")
            raise BackendUnavailable(
                f"Serve applications not RUNNING after {timeout_s:.0f}s (serving.ray."
                f"ready_timeout_s): {last}{hint}")
        time.sleep(poll_s)
