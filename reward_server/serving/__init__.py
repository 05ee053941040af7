"""Hosting: the judge and NLI engines as Ray Serve deployments behind engine adapters.

Public API (Ray is imported only when it is called)::

    engines = start_engines(config)          # RayEngines
    service = RewardService(config, judge=engines.judge, nli=engines.nli)
    ...
    engines.shutdown()

``start_engines`` starts an embedded local Ray (default) or joins ``serving.ray_address`` /
``RAY_ADDRESS``; deploys one Serve application per engine kind (``<app_prefix>-judge``,
``<app_prefix>-nli``; replicas = one engine each, ``@serve.batch`` re-batching, autoscaling
from :class:`~reward_server.serving.settings.DeploymentSettings`) or, with
``serving.deploy=false``, attaches to the ones already running; and returns adapters that
implement :class:`~reward_server.backends.base.JudgeEngine` /
:class:`~reward_server.backends.base.NLIEngine`, so the service never sees Ray.
It blocks (model loading included); call it before the event loop or via
``asyncio.to_thread``. Errors: Serve backpressure → ``Overloaded``; a replica dying mid-call is
retried ``serving.max_retries`` times, then ``BackendUnavailable``.

Ingress scale-out
-----------------
The gRPC ingress (``reward-server serve``) is stateless: all it holds is two Serve deployment
handles. Run N copies of it and put them behind one address:

- Ray cluster (``deploy/ray_cluster.yaml``): deploy the engine applications once
  (``serve deploy deploy/serve_config.yaml``, or the first ingress with ``serving.deploy=true``),
  then start one ingress per node with ``--set serving.deploy=false
  --set serving.ray_address=auto``; each attaches to the same applications
  (``serve.get_app_handle``) and a TCP/L4 load balancer (or client-side round robin over the
  node list) spreads the gRPC connections.
- Kubernetes (``deploy/kuberay/rayservice.yaml``): the RayService deploys the applications; the
  ingress runs as a Deployment of N pods (``serving.deploy=false``, ``RAY_ADDRESS`` pointing at the
  head service) behind a ClusterIP Service on the gRPC port; an HPA may scale N on CPU.

Each copy's handles route to every replica of the deployments (power-of-two-choices on queue
length), so batches form per replica from all ingresses' calls. During a scale event: new
replicas join the handles' routing tables within a few seconds (long poll), old ones are drained
(``graceful_shutdown_timeout_s``) before they stop, so clients see no errors from scaling itself;
a replica that crashes fails its in-flight calls, which the adapter resends once to a live
replica (``serving.max_retries``) before answering UNAVAILABLE; when every replica's queue is
full the handle refuses at once and the client gets RESOURCE_EXHAUSTED and backs off (the
client's bounded retry covers both). Adding or removing ingress pods drops only the gRPC
connections to a removed pod, after its ``server.grace_period_s`` drain (SIGTERM), and clients
reconnect to the Service address.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reward_server.config import RewardServerConfig
    from reward_server.serving._private.deployments import JudgeFactory, NLIFactory
    from reward_server.serving._private.runtime import RayEngines

__all__ = ["RayEngines", "start_engines"]


def start_engines(
    config: RewardServerConfig,
    *,
    judge_factory: JudgeFactory | None = None,
    nli_factory: NLIFactory | None = None,
) -> RayEngines:
    """Start/join Ray, deploy or attach to the engine applications, return their adapters.

    ``judge_factory`` / ``nli_factory`` replace :func:`reward_server.backends.factory.build_judge`
    / ``build_nli`` inside each replica (a picklable callable taking the backend settings):
    for tests and benchmarks that need e.g. a fake engine with latency.
    """
    from reward_server.serving._private.runtime import start_engines as _start

    return _start(config, judge_factory=judge_factory, nli_factory=nli_factory)


def __getattr__(name: str) -> Any:
    if name == "RayEngines":
        from reward_server.serving._private.runtime import RayEngines

        return RayEngines
    raise AttributeError(name)
