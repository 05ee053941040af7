"""Hosting: where the judge and NLI engines run, and the one batching stage in front of each.

Public API (Ray is imported only when ``serving.mode`` is ``ray``)::

    engines = start_engines(config.engines, config.serving)   # Engines (RayEngines on Ray)
    engines.judge, engines.nli                               # JudgeEngine / NLIEngine
    await engines.health()                                   # {"judge": Health, "nli": Health}
    await engines.close()

In-process, the engines are built in this process; on Ray, ``start_engines`` starts an embedded
local Ray (default) or joins ``serving.ray.address`` / ``RAY_ADDRESS``, deploys one Serve
application per engine (``<app_prefix>-judge``, ``<app_prefix>-nli``; replicas = one engine
each, autoscaling from :class:`~reward_server.serving.settings.DeploymentSettings`) or, with
``serving.ray.deploy=false``, attaches to the ones already running. Either way each engine sits
behind a :class:`~reward_server.serving.batching.Batcher` configured by its ``batching`` block.
Errors: Serve backpressure -> ``Overloaded``; a replica dying mid-call is retried
``serving.ray.max_retries`` times, then ``BackendUnavailable``.

``serving.ray.layout: service`` hosts the whole service instead of the engines: one application
whose replicas are composed above this layer (:mod:`reward_server.service_deployment`), deployed
and called by :mod:`reward_server.serving._private.service_host` with the same call policy.

Ingress scale-out
-----------------
The gRPC ingress (``reward-server serve``) is stateless: all it holds is two Serve deployment
handles. Run N copies of it and put them behind one address:

- Ray cluster (``deploy/ray_cluster.yaml``): deploy the engine applications once
  (``serve deploy deploy/serve_config.yaml``, or the first ingress with ``serving.ray.deploy=true``),
  then start one ingress per node with ``--set serving.ray.deploy=false
  --set serving.ray.address=auto``; each attaches to the same applications
  (``serve.get_app_handle``) and a TCP/L4 load balancer (or client-side round robin over the
  node list) spreads the gRPC connections.
- Kubernetes (``deploy/kuberay/rayservice.yaml``): the RayService deploys the applications; the
  ingress runs as a Deployment of N pods (``serving.ray.deploy=false``, ``RAY_ADDRESS`` pointing at the
  head service) behind a ClusterIP Service on the gRPC port; an HPA may scale N on CPU.

Each copy's handles route to every replica of the deployments (power-of-two-choices on queue
length), so batches form per replica from all ingresses' calls. During a scale event: new
replicas join the handles' routing tables within a few seconds (long poll), old ones are drained
(``graceful_shutdown_timeout_s``) before they stop, so clients see no errors from scaling itself;
a replica that crashes fails its in-flight calls, which the adapter resends once to a live
replica (``serving.ray.max_retries``) before answering UNAVAILABLE; when every replica's queue is
full the handle refuses at once and the client gets RESOURCE_EXHAUSTED and backs off (the
client's bounded retry covers both). Adding or removing ingress pods drops only the gRPC
connections to a removed pod, after its ``server.grace_period_s`` drain (SIGTERM), and clients
reconnect to the Service address.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reward_server.serving.engines import Engines, JudgeFactory, NLIFactory
from reward_server.serving.settings import ServingSettings
from reward_server.serving.start import start_engines

if TYPE_CHECKING:
    from reward_server.serving._private.runtime import RayEngines

__all__ = ["Engines", "JudgeFactory", "NLIFactory", "RayEngines", "ServingSettings", "start_engines"]


def __getattr__(name: str) -> Any:
    if name == "RayEngines":
        from reward_server.serving._private.runtime import RayEngines

        return RayEngines
    raise AttributeError(name)
