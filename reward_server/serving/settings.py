"""Where the engines run: in the server process, or as Ray Serve deployments.

With ``mode: ray`` each engine kind is one Ray Serve application holding one deployment
(``<app_prefix>-judge`` and ``<app_prefix>-nli``); every replica owns one engine built by
:mod:`reward_server.backends.factory`. The fields of :class:`DeploymentSettings` become the
deployment options (``autoscaling_config``, ``max_ongoing_requests``, ``max_queued_requests``,
``ray_actor_options``); the batch size comes from the engine's own ``batching`` block and
reaches the replicas as ``user_config`` (changeable at runtime through ``reconfigure``).
With ``ray.layout: service`` one application, ``<app_prefix>-service``, runs the whole service
per replica instead, sized by ``ray.service`` (no ``user_config``: each replica batches for its
own engines as ``engines.<kind>.batching`` says).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class DeploymentSettings(BaseModel):
    """One Ray Serve deployment (judge or NLI): replicas, resources, batching, backpressure."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_replicas: int = Field(1, ge=0, description="Autoscaling floor (0 allows scale to zero).")
    max_replicas: int = Field(
        1, ge=1, description="Autoscaling ceiling; Ray's autoscaler adds nodes when replicas "
        "do not fit (GPU worker groups in deploy/ray_cluster.yaml)."
    )
    initial_replicas: int | None = Field(
        None, ge=0, description="Replicas started at deploy time; None: min_replicas."
    )
    target_ongoing_requests: float = Field(
        8.0, gt=0.0, description="Autoscaling target of calls in flight or queued per replica. "
        "Keep it a few times the calls that fill one batch so batches stay full."
    )
    upscale_delay_s: float = Field(
        10.0, ge=0.0, description="Load must stay above target this long before scaling up."
    )
    downscale_delay_s: float = Field(
        120.0, ge=0.0, description="Load must stay below target this long before scaling down."
    )
    look_back_period_s: float = Field(
        30.0, gt=0.0, description="Window over which Serve averages the ongoing-request metric."
    )
    num_cpus: float = Field(1.0, ge=0.0, description="CPUs reserved per replica (0 or fractions "
                            "let several replicas share a small machine).")
    num_gpus: float = Field(
        0.0, ge=0.0, description="GPUs per replica; fractions pack small models on one GPU."
    )
    max_ongoing_requests: int = Field(
        256, ge=1, description="Calls one replica accepts at once. Far above Serve's default 5 so "
        "@serve.batch sees enough concurrent calls to fill a batch."
    )
    max_queued_requests: int = Field(
        2048, ge=1, description="Calls each caller (handle) queues when every replica is full; "
        "beyond it calls fail at once with Overloaded (gRPC RESOURCE_EXHAUSTED)."
    )
    unhealthy_after_failures: int = Field(
        5, ge=1, description="Consecutive failed engine batches after which the replica reports "
        "unhealthy and Serve replaces it."
    )
    health_check_period_s: float = Field(10.0, gt=0.0, description="Serve health check period.")
    health_check_timeout_s: float = Field(30.0, gt=0.0, description="Serve health check timeout.")
    graceful_shutdown_timeout_s: float = Field(
        20.0, ge=0.0, description="How long a stopping replica may finish in-flight batches."
    )
    graceful_shutdown_wait_loop_s: float = Field(
        2.0, gt=0.0, description="How often a stopping replica looks whether its calls in flight "
        "have ended (Serve's default): even an idle replica takes this long to stop, so each "
        "scale-down and each application deletion waits for it."
    )
    env_vars: dict[str, str] = Field(
        default_factory=dict, description="Environment variables of this deployment's replicas "
        "(Ray runtime_env env_vars), e.g. HF_HUB_OFFLINE: '1' on a machine without internet: "
        "models load from the local cache without asking the Hugging Face hub."
    )

    @model_validator(mode="after")
    def _bounds(self) -> DeploymentSettings:
        if self.max_replicas < self.min_replicas:
            raise ValueError(
                f"max_replicas ({self.max_replicas}) < min_replicas ({self.min_replicas}); "
                "raise max_replicas"
            )
        if self.initial_replicas is not None and not (
            self.min_replicas <= self.initial_replicas <= self.max_replicas
        ):
            raise ValueError("initial_replicas must lie in [min_replicas, max_replicas]")
        return self

    def user_config(self, *, max_items: int) -> dict[str, Any]:
        """The runtime knobs a replica's ``reconfigure`` receives (``max_items``: the engine's
        ``batching.max_items``, the most items one ``@serve.batch`` batch may hold)."""
        return {"max_batch_size": max_items, "unhealthy_after_failures": self.unhealthy_after_failures}

    def autoscaling_config(self) -> dict[str, Any]:
        """Ray Serve ``autoscaling_config`` (validated by Ray's own AutoscalingConfig)."""
        cfg: dict[str, Any] = {
            "min_replicas": self.min_replicas,
            "max_replicas": self.max_replicas,
            "target_ongoing_requests": self.target_ongoing_requests,
            "upscale_delay_s": self.upscale_delay_s,
            "downscale_delay_s": self.downscale_delay_s,
            "look_back_period_s": self.look_back_period_s,
        }
        if self.initial_replicas is not None:
            cfg["initial_replicas"] = self.initial_replicas
        return cfg

    def deployment_options(self, *, max_items: int | None) -> dict[str, Any]:
        """Keyword arguments for ``Deployment.options`` (same keys as a Serve config file);
        ``max_items`` None: no ``user_config`` (a deployment without ``reconfigure``)."""
        options: dict[str, Any] = {
            "autoscaling_config": self.autoscaling_config(),
            "max_ongoing_requests": self.max_ongoing_requests,
            "max_queued_requests": self.max_queued_requests,
            "ray_actor_options": {
                "num_cpus": self.num_cpus, "num_gpus": self.num_gpus,
                **({"runtime_env": {"env_vars": dict(self.env_vars)}} if self.env_vars else {}),
            },
            "health_check_period_s": self.health_check_period_s,
            "health_check_timeout_s": self.health_check_timeout_s,
            "graceful_shutdown_timeout_s": self.graceful_shutdown_timeout_s,
            "graceful_shutdown_wait_loop_s": self.graceful_shutdown_wait_loop_s,
        }
        if max_items is not None:
            options["user_config"] = self.user_config(max_items=max_items)
        return options


class RaySettings(BaseModel):
    """Ray Serve hosting (``serving.mode: ray``): the cluster, the applications, the calls."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    address: str | None = Field(
        None, description="Join this Ray cluster (host:port of its GCS, `auto`, or RAY_ADDRESS); "
        "None starts an embedded local Ray. Ray 2.60 clusters need a token: RAY_AUTH_MODE=token "
        "and RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH / ~/.ray/auth_token (a refusal fails at start "
        "with that fix)."
    )
    local_node_ip: str = Field(
        "127.0.0.1", description="Embedded local Ray only: the node address it advertises. "
        "A loopback address keeps every Ray listener (GCS, raylet, agents, workers, metrics) on "
        "loopback: `reward-server serve` sets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before Ray is "
        "imported, without which Ray 2.60 replaces 127.0.0.1 by the machine's address. Set the "
        "machine's address to let other nodes join (then Ray listens on all interfaces and its "
        "token auth, on by default, is the guard)."
    )
    node_temp_dir: str | None = Field(
        None, description="Joining only: attach this process to the Ray node on this host "
        "that was started with this `--temp-dir` (several nodes on one host, as in the "
        "multi-node tests); None: the head node if it runs on this host, else any node here."
    )
    namespace: str = Field("reward_server", description="Ray namespace the ingress joins.")
    app_prefix: str = Field(
        "reward", description="Serve application names: <app_prefix>-judge, <app_prefix>-nli."
    )
    deploy: bool = Field(
        True, description="True: deploy (or update) the applications with serve.run. False: "
        "attach to applications already running (deployed by deploy/serve_config.yaml or a "
        "KubeRay RayService): what the 2nd..Nth ingress copies do."
    )
    keep_apps_on_exit: bool = Field(
        False, description="With deploy: true, leave the applications this ingress deployed "
        "RUNNING when it exits (for other ingresses attached to them); false deletes them on "
        "exit. The exit log says which. An ingress with deploy: false never deletes."
    )
    log_to_driver: bool = Field(
        False, description="Forward Ray workers' stdout/stderr into the server's log. Off: the "
        "log carries only the server's own lines (once a process uses Serve, Ray forwards the "
        "output of every job's workers on the cluster, not just this server's); the engine "
        "replicas' output stays in Ray's logs (`ray logs`, the dashboard, "
        "<session dir>/logs/serve/)."
    )
    local_num_cpus: int | None = Field(
        None, ge=1, description="Embedded local Ray only: CPUs it may use; None: all."
    )
    local_num_gpus: int | None = Field(
        None, ge=0, description="Embedded local Ray only: GPUs it may use; None: all visible."
    )
    call_timeout_s: float = Field(
        300.0, gt=0.0, description="Longest one engine call through a handle may take before "
        "it fails with BackendUnavailable."
    )
    max_retries: int = Field(
        1, ge=0, le=3, description="Times a call whose replica died is resent (Serve routes it "
        "to a live replica); then BackendUnavailable."
    )
    transport: Literal["grpc", "actor"] = Field(
        "grpc", description="How the ingress sends engine calls to the replicas. grpc: Ray "
        "Serve's gRPC path from the handle straight to the replica (`_by_reference=False`); "
        "a call over the replica's gRPC message limit (4 MiB, Ray's "
        "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH) is resent as an actor call. actor: Ray "
        "actor calls (Serve's default). bench/microbatch.py on 2 cores: grpc gave 1.2x the "
        "items/s of actor through Ray."
    )
    layout: Literal["engines", "service"] = Field(
        "engines", description="What the Serve replicas run. engines: one application per "
        "engine (<app_prefix>-judge, <app_prefix>-nli); the gRPC ingress parses, validates and "
        "admits each call and sends the engines' batches to their replicas (two Ray hops per "
        "call that uses both engines). service: one application, <app_prefix>-service, whose "
        "replicas each run the whole reward service (both engines in process, parsing, "
        "admission, scoring); the ingress forwards each call's bytes to one replica (one hop) "
        "and answers with that replica's bytes. Sized by serving.ray.service; admission is per "
        "replica. bench/microbatch.py on 2 CPUs: see docs/performance.md."
    )
    ready_timeout_s: float = Field(
        600.0, gt=0.0, description="How long start-up waits for the applications to be RUNNING "
        "(model loading included)."
    )
    judge: DeploymentSettings = Field(
        default_factory=DeploymentSettings,
        description="The judge (rubric evaluator) deployment.",
    )
    nli: DeploymentSettings = Field(
        default_factory=DeploymentSettings,
        description="The NLI verifier deployment (not deployed with engines.nli.kind=judge: "
        "judge-as-NLI then calls the judge deployment).",
    )

    service: DeploymentSettings = Field(
        default_factory=DeploymentSettings,
        description="The service deployment (layout: service only): its replicas each hold "
        "both engines, so give them the judge's resources (num_gpus) on a GPU cluster. The "
        "replica runs the service on its own event loop "
        "(RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0 is added to env_vars unless set there).",
    )

    @model_validator(mode="after")
    def _deployments_of_the_layout(self) -> RaySettings:
        ignored = ("judge", "nli") if self.layout == "service" else ("service",)
        for name in ignored:
            if name in self.model_fields_set and getattr(self, name).model_fields_set:
                used = "serving.ray.service" if self.layout == "service" else (
                    "serving.ray.judge / serving.ray.nli")
                raise ValueError(
                    f"serving.ray.{name} is set but serving.ray.layout is {self.layout}, whose "
                    f"replicas are sized by {used}; move the settings there or set the layout"
                )
        return self

    def app_name(self, kind: Literal["judge", "nli", "service"]) -> str:
        return f"{self.app_prefix}-{kind}"


class ServingSettings(BaseModel):
    """Hosting of the judge and NLI engines."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["inprocess", "ray"] = Field(
        "inprocess",
        description="inprocess: engines live in the gRPC server's process (tests, laptops); "
        "ray: engines are Ray Serve deployments behind handles.",
    )
    ray: RaySettings = Field(
        default_factory=RaySettings,
        description="Ray Serve hosting; only with mode: ray.",
    )

    @model_validator(mode="after")
    def _ray_only_with_ray(self) -> ServingSettings:
        if self.mode != "ray" and "ray" in self.model_fields_set and self.ray.model_fields_set:
            raise ValueError(
                f"serving.ray.{sorted(self.ray.model_fields_set)[0]} is set but serving.mode is "
                "inprocess, where it would be ignored; set serving.mode=ray (serve --ray) or "
                "remove serving.ray"
            )
        return self
