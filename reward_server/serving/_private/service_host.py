"""``serving.ray.layout: service``: one Serve application whose replicas each run the whole
reward service; this process forwards each call to one of them (one Ray hop per call).

What runs in a replica is composed above this layer (:mod:`reward_server.service_deployment`
builds the bound application and hands it here); this module starts or joins Ray, deploys or
attaches to the application, and calls it with :class:`HandleCaller`'s policy: Serve's
backpressure is ``Overloaded``, a replica that dies mid-call is retried
``serving.ray.max_retries`` times on another, the errors a replica raises come back as ours.
"""

from __future__ import annotations

import logging
from typing import Any

from reward_server.backends.base import Health
from reward_server.backends.settings import EnginesSettings
from reward_server.errors import EngineError
from reward_server.serving._private.adapters import HandleCaller
from reward_server.serving._private.apps import AppsHost, AppsStart, app_info, model_of, start_apps
from reward_server.serving._private.watch import AppWatch
from reward_server.serving.settings import RaySettings

logger = logging.getLogger(__name__)


class ServiceHost(AppsHost):
    """The service application this process deployed or attached to: :meth:`forward` one call
    to a replica, its :meth:`health`, and its shutdown (:meth:`close`)."""

    def __init__(self, *, caller: HandleCaller, model_id: str, start: AppsStart) -> None:
        super().__init__(callers=[caller], attached=[caller.app], start=start)
        self._caller = caller
        self.model_id = model_id

    @property
    def app_name(self) -> str:
        return self._caller.app

    async def forward(self, rpc: str, raw: bytes, *, timeout_s: float, attempts: int) -> bytes:
        """Method ``rpc`` with request bytes ``raw`` on one replica: its response bytes."""
        (out,) = await self._caller.call("call", [(rpc, raw, timeout_s, attempts)])
        if not isinstance(out, bytes):
            raise EngineError(f"the service replica answered {type(out).__name__}, not bytes")
        return out

    async def health(self) -> dict[str, Health]:
        """Healthy iff the application has a RUNNING replica (a replica whose engines fail
        its health check is replaced by Serve)."""
        return {"service": await self._caller.health.check()}


def start_service_host(
    settings: RaySettings, application: Any | None, *, engines: EnginesSettings
) -> ServiceHost:
    """Deploy ``application`` (a bound service deployment; None with ``serving.ray.deploy:
    false``, which attaches to the running one) as ``<app_prefix>-service`` and wait until it
    runs; ``engines``: what the user configured, named in the progress lines."""
    if settings.deploy and application is None:
        raise ValueError("serving.ray.deploy is true: give the application to deploy")
    model = " + ".join(model_of(e) for e in (engines.judge, engines.nli) if e is not None)
    name = settings.app_name("service")
    with start_apps(settings) as start:
        handles = start.deploy(lambda: {name: application},
                               [AppWatch(name, model, "service")])
        handle = handles[name]
        caller = HandleCaller(handle, deployment="service", app=name,
                              timeout_s=settings.call_timeout_s,
                              max_retries=settings.max_retries, transport=settings.transport)
        model_id = str(app_info(handle, settings.ready_timeout_s)["model_id"])
    return ServiceHost(caller=caller, model_id=model_id, start=start)
