"""Every deploy manifest parses and says what matters: ports, autoscaling bounds, resources,
entrypoints. Serve configs are validated with Ray's own schema classes, the `ray up` file with
Ray's own autoscaler JSON schema."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import ray
import yaml
from ray.serve.schema import DeploymentSchema, ServeDeploySchema

from reward_server import app as serve_app
from reward_server.config import load_config
from reward_server.serving.settings import DeploymentSettings, RaySettings

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
GRPC_PORT = 50051


def _yaml(name: str) -> Any:
    return yaml.safe_load((DEPLOY / name).read_text())


def _docs(name: str) -> dict[str, list[dict[str, Any]]]:
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for doc in yaml.safe_load_all((DEPLOY / name).read_text()):
        by_kind.setdefault(doc["kind"], []).append(doc)
    return by_kind


def _check_serve_config(raw: dict[str, Any]) -> ServeDeploySchema:
    schema = ServeDeploySchema.model_validate(raw)
    apps = {a.name: a for a in schema.applications}
    assert set(apps) == {"reward-judge", "reward-nli"}
    ray_settings = RaySettings.model_validate({})
    assert ray_settings.app_name("judge") in apps and ray_settings.app_name("nli") in apps
    expected_cls = {"reward-judge": "JudgeDeployment", "reward-nli": "NLIDeployment"}
    user_keys = set(DeploymentSettings.model_validate({}).user_config(max_items=1))
    for name, a in apps.items():
        module, _, attr = a.import_path.partition(":")
        assert module == "reward_server.app" and callable(getattr(serve_app, attr))
        (dep,) = a.deployments
        assert dep.name == expected_cls[name]
        assert dep.max_ongoing_requests > 5  # above Serve's default so batches fill
        assert 0 < dep.max_queued_requests <= 10_000  # bounded queue: fail fast beyond
        auto = dep.autoscaling_config
        assert 1 <= auto["min_replicas"] <= auto["initial_replicas"] <= auto["max_replicas"]
        assert auto["target_ongoing_requests"] > 0
        assert dep.ray_actor_options.num_gpus > 0
        # the batch size is not set here: it comes from engines.<kind>.batching.max_items
        assert set(dep.user_config) == user_keys - {"max_batch_size"}
    assert apps["reward-judge"].deployments[0].ray_actor_options.num_gpus == 1
    return schema


def test_serve_config_is_valid_for_ray_serve() -> None:
    raw = _yaml("serve_config.yaml")
    _check_serve_config(raw)
    assert raw["proxy_location"] == "Disabled"  # our own gRPC ingress holds the handles


@pytest.mark.parametrize("builder", ["judge_app", "nli_app"])
def test_serve_config_args_build_applications(builder: str) -> None:
    apps = {a["name"]: a for a in _yaml("serve_config.yaml")["applications"]}
    app = next(a for a in apps.values() if a["import_path"].endswith(builder))
    # the config path points into the container; the overrides must be valid config keys
    built = getattr(serve_app, builder)({"overrides": app["args"]["overrides"]})
    assert type(built).__name__ == "Application"


def test_settings_produce_valid_deployment_options() -> None:
    for kind in ("judge", "nli"):
        settings = getattr(RaySettings.model_validate({}), kind)
        opts = settings.deployment_options(max_items=96)
        DeploymentSchema.model_validate({"name": "X", **opts})
        assert opts["max_ongoing_requests"] == 256 and opts["max_queued_requests"] == 2048
        assert opts["user_config"]["max_batch_size"] == 96


def test_settings_refuse_inverted_replica_bounds() -> None:
    with pytest.raises(ValueError, match="max_replicas"):
        DeploymentSettings.model_validate({"min_replicas": 3, "max_replicas": 2})


def test_ray_cluster_yaml_matches_rays_autoscaler_schema() -> None:
    raw = _yaml("ray_cluster.yaml")
    schema_path = Path(ray.__file__).parent / "autoscaler" / "ray-schema.json"
    jsonschema.validate(raw, json.loads(schema_path.read_text()))
    types = raw["available_node_types"]
    head = types[raw["head_node_type"]]
    assert "GPU" not in head["resources"] and head["resources"]["CPU"] == 0
    gpu_groups = [t for n, t in types.items() if n != raw["head_node_type"]]
    assert gpu_groups and all(t["resources"]["GPU"] >= 1 for t in gpu_groups)
    assert all(0 <= t["min_workers"] <= t["max_workers"] for t in gpu_groups)
    assert sum(t["max_workers"] for t in gpu_groups) <= raw["max_workers"]
    assert raw["idle_timeout_minutes"] > 0
    assert any("ray start --head" in c for c in raw["head_start_ray_commands"])


def test_cluster_reward_server_config_loads_and_attaches() -> None:
    config = load_config(DEPLOY / "reward_server_config.yaml", env={})
    assert config.serving.mode == "ray" and config.serving.ray.deploy is False
    assert config.server.port == GRPC_PORT and config.server.host == "0.0.0.0"
    assert config.serving.ray.app_name("judge") == "reward-judge"
    assert config.engines.judge is not None and config.engines.judge.kind == "vllm"
    assert config.engines.nli is not None and config.engines.nli.kind == "transformers"


def test_cpu_local_config_loads() -> None:
    config = load_config(DEPLOY / "cpu_local.yaml", env={})
    assert config.engines.judge is not None and config.engines.judge.kind == "transformers"
    assert config.engines.nli is not None and config.engines.nli.kind == "judge"
    assert config.serving.mode == "ray" and not config.engines.fake


def test_rayservice_embeds_the_serve_config_and_exposes_grpc() -> None:
    docs = _docs("kuberay/rayservice.yaml")
    assert set(docs) == {
        "ConfigMap", "RayService", "Deployment", "Service", "HorizontalPodAutoscaler",
    }
    (rs,) = docs["RayService"]
    assert rs["apiVersion"] == "ray.io/v1"
    embedded = yaml.safe_load(rs["spec"]["serveConfigV2"])
    _check_serve_config(embedded)
    assert embedded["applications"] == _yaml("serve_config.yaml")["applications"]
    cluster = rs["spec"]["rayClusterConfig"]
    assert cluster["rayVersion"] == ray.__version__
    assert cluster["enableInTreeAutoscaling"] is True
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    for group in cluster["workerGroupSpecs"]:
        assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        (container,) = group["template"]["spec"]["containers"]
        assert int(container["resources"]["limits"]["nvidia.com/gpu"]) >= 1

    (cm,) = docs["ConfigMap"]
    cfg = yaml.safe_load(cm["data"]["config.yaml"])
    assert cfg == _yaml("reward_server_config.yaml")

    (ingress,) = docs["Deployment"]
    pod = ingress["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["grpc"] == GRPC_PORT
    assert container["readinessProbe"]["grpc"]["port"] == GRPC_PORT  # grpc.health.v1
    script = " ".join(container["args"])
    assert "ray start --address=reward-server-head-svc:6379 --num-cpus=0" in script
    assert re.search(r"reward-server serve --config /etc/reward-server/config.yaml", script)
    assert pod["terminationGracePeriodSeconds"] > load_config(env={}).server.grace_period_s
    labels = ingress["spec"]["template"]["metadata"]["labels"]
    assert ingress["spec"]["selector"]["matchLabels"] == labels
    for svc in docs["Service"]:
        assert svc["spec"]["selector"] == labels
        grpc = next(p for p in svc["spec"]["ports"] if p["name"] == "grpc")
        assert grpc["port"] == GRPC_PORT and grpc["targetPort"] == "grpc"
        assert grpc["appProtocol"] == "grpc"
    assert {s["spec"].get("clusterIP") for s in docs["Service"]} == {None, "None"}
    (hpa,) = docs["HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == ingress["metadata"]["name"]
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]


def test_rayjob_runs_the_verl_trainer() -> None:
    (job,) = _docs("kuberay/rayjob.yaml")["RayJob"]
    spec = job["spec"]
    argv = shlex.split(spec["entrypoint"])
    assert argv[:4] == ["python", "trainer/run.py", "--engine", "verl"]
    from trainer.run import parser

    args, overrides = parser().parse_known_args(argv[2:])
    # the headless Service: one address per ingress pod, spread round robin by the client
    headless = f"dns:///reward-server-grpc-headless:{GRPC_PORT}"
    assert args.engine == "verl" and args.reward_server == headless
    assert all("=" in o for o in overrides)  # the rest are Hydra key=value overrides
    assert spec["shutdownAfterJobFinishes"] is True
    env = yaml.safe_load(spec["runtimeEnvYAML"])
    assert env["env_vars"]["REWARD_SERVER_ADDRESS"] == headless
    from reward_server.client import channel_target

    assert channel_target(headless) == headless  # used as is: gRPC's dns resolver
    service_names = {s["metadata"]["name"] for s in _docs("kuberay/rayservice.yaml")["Service"]}
    assert "reward-server-grpc-headless" in service_names
    cluster = spec["rayClusterSpec"]
    assert cluster["rayVersion"] == ray.__version__
    (group,) = cluster["workerGroupSpecs"]
    (container,) = group["template"]["spec"]["containers"]
    assert int(container["resources"]["limits"]["nvidia.com/gpu"]) >= 1


def test_dockerfile_matches_ray_and_exposes_grpc() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    image = re.search(r"^ARG RAY_IMAGE=(\S+)$", text, re.M)
    assert image and image.group(1).startswith(f"rayproject/ray:{ray.__version__}-")
    assert re.search(rf"^EXPOSE .*\b{GRPC_PORT}\b", text, re.M)
    for src in re.findall(r"^COPY (?:--\S+ )*(.+) \S+$", text, re.M):
        for path in src.split():
            assert (DEPLOY.parent / path).exists(), path
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M).group(1))  # type: ignore[union-attr]
    assert cmd[:2] == ["reward-server", "serve"]
