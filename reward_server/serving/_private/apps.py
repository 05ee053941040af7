"""The Serve applications a process deploys or attaches to, and leaving them::

    with start_apps(settings) as start:       # Ray started or joined; on failure, left again
        handles = start.deploy(build, watches)  # deployed (or attached to) and RUNNING
        ...                                     # app_info(handle, ...), the callers
    return SomeHost(..., start=start)           # an AppsHost: close() leaves them on exit

Shared by the engine applications (:mod:`~reward_server.serving._private.runtime`) and the
service application (:mod:`~reward_server.serving._private.service_host`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import ray
from ray import serve
from ray.serve.api import RunTarget
from ray.serve.handle import DeploymentHandle

from reward_server.serving._private.adapters import HandleCaller
from reward_server.serving._private.watch import AppWatch, wait_apps_running
from reward_server.serving.ray_cluster import (
    SINGLE_NODE_ENV,
    check_cluster,
    is_loopback,
    private_ray_token,
)
from reward_server.serving.settings import RaySettings

logger = logging.getLogger(__name__)
T = TypeVar("T")


def blocking(fn: Callable[[], T]) -> T:
    """Run a blocking Ray call off the current thread (it may host a running event loop)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(fn).result()


def delete_apps(names: list[str], timeout_s: float = 60.0) -> None:
    """Delete Serve applications together (not one after the other) and wait until gone."""
    if not names:
        return
    for name in names:
        serve.delete(name, _blocking=False)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        apps = serve.status().applications
        if not any(n in apps and not str(apps[n].status).endswith("NOT_STARTED") for n in names):
            return
        time.sleep(0.1)
    logger.warning("Serve applications %s not deleted after %.0fs", names, timeout_s)


@dataclass
class AppsStart:
    """A start of Serve applications under way (:func:`start_apps`): whether this process
    started (``owns_ray``) or joined (``connected_ray``) Ray, and what it deployed."""

    settings: RaySettings
    owns_ray: bool
    connected_ray: bool
    deployed: list[str] = field(default_factory=list)

    def deploy(
        self, build: Callable[[], dict[str, Any]], watches: list[AppWatch]
    ) -> dict[str, DeploymentHandle[Any]]:
        """Deploy the applications ``build()`` makes (name -> bound application; with
        ``serving.ray.deploy: false`` none: attach to the running ones), wait until all of
        ``watches`` are RUNNING, and return a handle per application."""
        apps: dict[str, Any] = {}
        if self.settings.deploy:
            blocking(lambda: serve.start(proxy_location="Disabled"))
            apps = build()
        return deploy_and_wait(apps, watches, self.settings, owns_ray=self.owns_ray,
                               deployed=self.deployed)


@contextlib.contextmanager
def start_apps(settings: RaySettings) -> Iterator[AppsStart]:
    """Start or join Ray (:func:`ensure_ray`); if the start fails, leave what it deployed."""
    owns_ray, connected = ensure_ray(settings)
    start = AppsStart(settings, owns_ray=owns_ray, connected_ray=connected)
    try:
        yield start
    except BaseException:
        failed_start(start.deployed, settings, owns_ray=owns_ray)
        raise


class AppsHost:
    """The Serve applications this process deployed or attached to (their callers), and
    leaving them: :meth:`close` / :meth:`shutdown`."""

    def __init__(self, *, callers: list[HandleCaller], attached: list[str], start: AppsStart) -> None:
        self._callers = callers
        self._attached = attached  # the applications, when attached to (deploy: false)
        self._settings = start.settings
        self._deployed = start.deployed
        self._owns_ray = start.owns_ray
        self._connected_ray = start.connected_ray
        self._closed = False

    async def close(self) -> None:
        """Shut down the routers of this loop's calls, then :meth:`shutdown`."""
        stopping = not self._closed and (self._owns_ray or self._connected_ray)
        for caller in self._callers:
            await caller.close(ray_stopping=stopping)
        self.shutdown()

    def shutdown(self) -> None:
        """Delete the applications this process deployed (unless
        ``serving.ray.keep_apps_on_exit``), then stop or leave Ray as appropriate."""
        if self._closed:
            return
        self._closed = True
        try:
            attached = [] if self._settings.deploy else self._attached
            leave_apps(self._deployed, attached, self._settings, owns_ray=self._owns_ray)
            if self._owns_ray:
                blocking(serve.shutdown)
        finally:
            if self._owns_ray or self._connected_ray:
                ray.shutdown()


def leave_apps(
    deployed: list[str], attached: list[str], settings: RaySettings, *, owns_ray: bool
) -> None:
    """On exit: delete the applications this ingress deployed, unless told to keep them (or
    Ray itself goes with this process), and say which it did. Attached ones are never touched."""
    if owns_ray:
        blocking(lambda: delete_apps(deployed))
        logger.info("stopping the embedded local Ray with the Serve applications on it: %s",
                    ", ".join(deployed) or "none")
    elif deployed and settings.keep_apps_on_exit:
        logger.info("leaving the Serve applications this ingress deployed RUNNING: %s "
                    "(serving.ray.keep_apps_on_exit=true; remove them with serve.delete(name) in "
                    "Python, or all applications with `serve shutdown`)", ", ".join(deployed))
    elif deployed:
        blocking(lambda: delete_apps(deployed))
        logger.info("deleted the Serve applications this ingress deployed: %s "
                    "(serving.ray.keep_apps_on_exit=true keeps them)", ", ".join(deployed))
    if attached:
        logger.info("left the attached Serve applications running (serving.ray.deploy=false "
                    "never deletes): %s", ", ".join(attached))


def ensure_ray(settings: RaySettings) -> tuple[bool, bool]:
    """(owns_ray, connected_ray): started a local Ray here / joined an external cluster here.

    ``log_to_driver`` is off unless ``serving.ray.log_to_driver``: Serve turns off Ray's
    per-job filter of forwarded worker output in every process that uses it
    (``ray.serve._private.api``: ``_filter_logs_by_job = False``), so with it on the server's
    log would carry the output of every job's workers on the cluster.

    Joining: the cluster's token auth is checked first (a refusal fails in seconds with the
    fix, see :mod:`reward_server.serving.ray_cluster`). Starting: the embedded Ray advertises
    ``local_node_ip`` (127.0.0.1 by default) and runs no dashboard; token auth stays on
    (Ray's default for a cluster it starts, unless ``RAY_AUTH_MODE`` says otherwise).
    """
    if ray.is_initialized():
        return False, False
    address = settings.address or os.environ.get("RAY_ADDRESS")
    if address:
        check_cluster(address)
        logger.info("joining Ray cluster at %s (namespace %s, node %s)", address,
                    settings.namespace, settings.node_temp_dir or "head or any on this host")
        ray.init(address=address, namespace=settings.namespace,
                 log_to_driver=settings.log_to_driver, _temp_dir=settings.node_temp_dir)
        return False, True
    logger.info("starting an embedded local Ray on %s", settings.local_node_ip)
    private_ray_token()  # Ray would write a missing ~/.ray/auth_token readable by all
    ray.init(
        num_cpus=settings.local_num_cpus,
        num_gpus=settings.local_num_gpus,
        namespace=settings.namespace,
        include_dashboard=False,
        log_to_driver=settings.log_to_driver,
        _node_ip_address=settings.local_node_ip,
    )
    node_ip = ray.util.get_node_ip_address()
    if is_loopback(settings.local_node_ip) and not is_loopback(node_ip):
        logger.warning(
            "the embedded Ray advertises %s, not %s: its processes listen on the machine's "
            "interfaces, guarded by Ray's token auth. Ray keeps loopback only with %s=0 set "
            "before ray is imported (`reward-server serve` sets it)", node_ip,
            settings.local_node_ip, SINGLE_NODE_ENV)
    return True, False


def failed_start(deployed: list[str], settings: RaySettings, *, owns_ray: bool) -> None:
    """Start-up failed: leave what it deployed."""
    if owns_ray:  # Ray goes with this process: its applications with it, no waiting
        # for Serve's graceful shutdown of replicas that failed to start (seconds)
        logger.info("stopping the embedded local Ray (Serve applications: %s)",
                    ", ".join(deployed) or "none")
        ray.shutdown()
    else:
        leave_apps(deployed, [], settings, owns_ray=False)


def deploy_and_wait(
    apps: dict[str, Any], watches: list[AppWatch], settings: RaySettings, *, owns_ray: bool,
    deployed: list[str],
) -> dict[str, DeploymentHandle[Any]]:
    """Deploy ``apps`` (name -> bound application; empty when attaching) together, wait until
    all of ``watches`` are RUNNING with a progress line per change and a one-line failure
    (:mod:`~reward_server.serving._private.watch`), and return a handle per application."""
    if apps:
        logger.info("deploying Serve applications %s", ", ".join(apps))
        deployed += list(apps)  # before run_many: a failed deploy is cleaned up too
        targets = [RunTarget(target=app, name=name, route_prefix=None) for name, app in apps.items()]
        blocking(lambda: serve.run_many(targets, wait_for_applications_running=False))
    else:
        logger.info("attaching to Serve applications %s (serving.ray.deploy=false)",
                    ", ".join(w.app for w in watches))
    blocking(lambda: wait_apps_running(
        watches, timeout_s=settings.ready_timeout_s, fail_fast=bool(apps),
        placement="fail" if owns_ray else "wait"))
    names = [w.app for w in watches]
    return blocking(lambda: {name: serve.get_app_handle(name) for name in names})


def model_of(engine: Any) -> str:
    """What the user named as the engine's model (a fake names its model_id)."""
    return str(getattr(engine, "model", None) or getattr(engine, "model_id", None) or engine.kind)


def app_info(handle: DeploymentHandle[Any], timeout_s: float) -> dict[str, Any]:
    out: dict[str, Any] = blocking(lambda: handle.info.remote().result(timeout_s=timeout_s))
    return out


