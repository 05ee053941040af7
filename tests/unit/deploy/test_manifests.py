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
from reward_server.config import RewardServerConfig, load_config
from reward_server.serving.settings import DeploymentSettings, RaySettings

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
GRPC_PORT = 50051
HTTP_PORT = 8080
INSTALL_ROOT = "/home/ray/reward-server"  # deploy/Dockerfile's WORKDIR


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
    assert any("deploy/commands.sh head" in c for c in raw["head_start_ray_commands"])


def test_cluster_reward_server_config_loads_and_attaches() -> None:
    config = load_config(DEPLOY / "reward_server_config.yaml", env={})
    assert config.serving.mode == "ray" and config.serving.ray.deploy is False
    assert config.server.port == GRPC_PORT and config.server.host == "0.0.0.0"
    assert config.serving.ray.app_name("judge") == "reward-judge"
    assert config.engines.judge is not None and config.engines.judge.kind == "vllm"
    assert config.engines.nli is not None and config.engines.nli.kind == "transformers"


def test_cpu_local_config_loads() -> None:
    config = load_config(DEPLOY / "cpu_local.yaml", env={})
    # offline: its judge replicas never wait on the Hugging Face hub's retries
    opts = config.serving.ray.judge.deployment_options(max_items=8)
    DeploymentSchema.model_validate({"name": "X", **opts})
    assert opts["ray_actor_options"]["runtime_env"] == {"env_vars": {"HF_HUB_OFFLINE": "1"}}
    assert "runtime_env" not in RaySettings.model_validate({}).judge.deployment_options(
        max_items=8)["ray_actor_options"]
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
    # grpc.health.v1 on the health port (server.health_port: auto = the main port + 1)
    assert load_config(DEPLOY / "reward_server_config.yaml", env={}).server.health_port == "auto"
    assert ports["grpc-health"] == GRPC_PORT + 1
    for probe in ("readinessProbe", "startupProbe"):
        assert container[probe]["grpc"]["port"] == GRPC_PORT + 1
    assert container["livenessProbe"]["tcpSocket"]["port"] == GRPC_PORT + 1
    # the ingress pod's command is written once, in deploy/commands.sh
    assert container["command"] == [f"{INSTALL_ROOT}/deploy/commands.sh", "ingress-node"]
    env = {e["name"]: e for e in container["env"]}
    assert env["RAY_HEAD_ADDRESS"]["value"] == "reward-server-head-svc:6379"
    assert "reward-server-head-svc" not in {s["metadata"]["name"] for s in docs["Service"]}
    assert ports["http"] == load_config(DEPLOY / "reward_server_config.yaml", env={}).server.http.port
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
    assert re.search(rf"^EXPOSE .*\b{HTTP_PORT}\b", text, re.M)  # the HTTP door
    assert re.search(rf"^WORKDIR {INSTALL_ROOT}$", text, re.M)
    for src in re.findall(r"^COPY (?:--\S+ )*(.+) \S+$", text, re.M):
        for path in src.split():
            assert (DEPLOY.parent / path).exists(), path
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M).group(1))  # type: ignore[union-attr]
    assert cmd == [f"{INSTALL_ROOT}/deploy/commands.sh", "ingress"]  # written once, there


# ------------------------------------------------------------------ tokens in every manifest
RAY_SECRET = {"name": "ray-auth-token", "key": "auth_token"}  # KubeRay authOptions' key
SERVER_SECRET = {"name": "reward-server-token", "key": "token"}


def _pods(doc: Any) -> list[tuple[str, dict[str, Any]]]:
    """(where, pod spec) for every pod template of a manifest document."""
    found: list[tuple[str, dict[str, Any]]] = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if "containers" in node:
                found.append((where, node))
            for k, v in node.items():
                walk(v, f"{where}.{k}")
        elif isinstance(node, list):
            for v in node:
                walk(v, where)

    walk(doc, doc["kind"])
    return found


def _containers(doc: Any) -> list[tuple[str, dict[str, Any]]]:
    """(where, container) for every container anywhere in a manifest document."""
    return [(f"{where}.{c['name']}", c) for where, pod in _pods(doc) for c in pod["containers"]]


def _secret_env(container: dict[str, Any], name: str) -> dict[str, str] | None:
    for e in container.get("env", []):
        if e["name"] == name:
            ref: dict[str, str] | None = e.get("valueFrom", {}).get("secretKeyRef")
            return ref
    return None


def _plain_env(container: dict[str, Any], name: str) -> str | None:
    return next((e.get("value") for e in container.get("env", []) if e["name"] == name), None)


def _kube_docs() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for name in ("kuberay/rayservice.yaml", "kuberay/rayjob.yaml"):
        docs += list(yaml.safe_load_all((DEPLOY / name).read_text()))
    return docs


def test_every_kuberay_container_joins_ray_with_the_token_from_one_secret() -> None:
    """Head, GPU workers, ingress pods, the RayJob's cluster and its submitter: Ray token auth
    on, the token from the same Secret (and the operator told of it by authOptions)."""
    containers = [c for d in _kube_docs() for c in _containers(d)]
    assert len(containers) == 7, [w for w, _ in containers]
    for where, c in containers:
        assert _plain_env(c, "RAY_AUTH_MODE") == "token", where
        ref = _secret_env(c, "RAY_AUTH_TOKEN")
        assert ref is not None and {k: ref[k] for k in ("name", "key")} == RAY_SECRET, where
        assert ref.get("optional") is not True, where
    clusters = [d["spec"]["rayClusterConfig"] if d["kind"] == "RayService" else d["spec"]["rayClusterSpec"]
                for d in _kube_docs() if d["kind"] in ("RayService", "RayJob")]
    assert len(clusters) == 2
    for cluster in clusters:
        assert cluster["authOptions"] == {"mode": "token", "secretName": RAY_SECRET["name"]}


def test_the_server_token_is_a_file_from_one_secret_for_the_ingress_and_the_trainer() -> None:
    """The ingress and the trainer's pods (the driver on the head; reward calls from workers too)
    read the token from the Secret mounted as a file (REWARD_SERVER_TOKEN_FILE), readable by
    the image's user (fsGroup 100, mode 0440); the token is in no environment variable."""
    pods = [(w, pod) for d in _kube_docs() for w, pod in _pods(d)]
    holders = []
    for where, pod in pods:
        (container, *_) = pod["containers"]
        assert _secret_env(container, "REWARD_SERVER_TOKEN") is None, where
        path = _plain_env(container, "REWARD_SERVER_TOKEN_FILE")
        if path is None:
            continue
        holders.append(where)
        volumes = {v["name"]: v for v in pod["volumes"]}
        (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
        secret = volumes[mount["name"]]["secret"]
        assert secret["secretName"] == SERVER_SECRET["name"] and secret.get("optional") is not True
        assert path == f"{mount['mountPath']}/{SERVER_SECRET['key']}" and mount["readOnly"] is True
        assert secret["defaultMode"] == 0o440 and pod["securityContext"]["fsGroup"] == 100
    assert sorted(holders) == ["Deployment.spec.template.spec",
                               "RayJob.spec.rayClusterSpec.headGroupSpec.template.spec",
                               "RayJob.spec.rayClusterSpec.workerGroupSpecs.template.spec"]


def test_liveness_is_the_process_and_readiness_the_serving_status() -> None:
    """The health port says NOT_SERVING while an engine is down, while the main port's
    connections are at their cap and while draining: readiness (out of the Services until it
    passes again). A restart cures none of these, so liveness only asks whether the process
    still accepts connections on that port."""
    (ingress,) = _docs("kuberay/rayservice.yaml")["Deployment"]
    (container,) = ingress["spec"]["template"]["spec"]["containers"]
    health = next(p["containerPort"] for p in container["ports"] if p["name"] == "grpc-health")
    assert container["readinessProbe"]["grpc"] == {"port": health, "service": ""}
    assert container["startupProbe"]["grpc"]["port"] == health
    live = container["livenessProbe"]
    assert "grpc" not in live and "httpGet" not in live and live["tcpSocket"] == {"port": health}


def test_ray_up_syncs_both_tokens_to_every_node_and_turns_token_auth_on() -> None:
    raw = _yaml("ray_cluster.yaml")
    opts = " ".join(raw["docker"]["run_options"])
    env = dict(re.findall(r"--env (\w+)=(\S+)", opts))
    assert env["RAY_AUTH_MODE"] == "token"
    mounts = raw["file_mounts"]
    assert mounts[env["RAY_AUTH_TOKEN_PATH"]] == "~/.ray/auth_token"  # where `ray get-auth-token` writes
    assert env["REWARD_SERVER_TOKEN_FILE"] in mounts
    assert mounts["/etc/reward-server/config.yaml"] == "./deploy/reward_server_config.yaml"
    assert mounts[f"{INSTALL_ROOT}/deploy"] == "./deploy"


def _commands_sh_calls(lines: list[str]) -> list[str]:
    return re.findall(r"deploy/commands\.sh (\S+)", " ".join(lines))


def test_every_cluster_command_is_written_once_in_commands_sh() -> None:
    raw = _yaml("ray_cluster.yaml")
    assert _commands_sh_calls(raw["head_start_ray_commands"]) == ["head", "serve-deploy", "ingress"]
    assert _commands_sh_calls(raw["worker_start_ray_commands"]) == ["worker", "ingress"]
    for line in raw["head_start_ray_commands"] + raw["worker_start_ray_commands"]:
        assert "ray start" not in line and "reward-server serve" not in line, line
    text = (DEPLOY / "commands.sh").read_text()
    for sub in ("head", "worker", "serve-deploy", "ingress", "ingress-node"):
        assert re.search(rf"^    {sub}\)$", text, re.M), sub
    assert "--config \"$REWARD_SERVER_CONFIG\"" in text
    assert 'REWARD_SERVER_CONFIG="${REWARD_SERVER_CONFIG:-/etc/reward-server/config.yaml}"' in text


def _commands_env() -> dict[str, str]:
    import os

    return {"PATH": os.environ["PATH"], "HOME": "/nonexistent"}


def test_commands_refuse_to_start_without_a_ray_token() -> None:
    import subprocess

    for sub in ("head", "worker", "serve-deploy", "ingress", "ingress-node"):
        proc = subprocess.run([str(DEPLOY / "commands.sh"), sub], env=_commands_env(),
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2, (sub, proc.stderr)
        assert "RAY_AUTH_TOKEN" in proc.stderr and "ray-auth-token" in proc.stderr, proc.stderr


def test_worker_commands_say_which_head_when_none_is_given(tmp_path: Path) -> None:
    import subprocess

    token = tmp_path / "t"
    token.write_text("0" * 64)
    for sub in ("worker", "ingress-node"):
        proc = subprocess.run([str(DEPLOY / "commands.sh"), sub],
                              env={**_commands_env(), "RAY_AUTH_TOKEN_PATH": str(token)},
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2 and "RAY_HEAD_ADDRESS" in proc.stderr, proc.stderr


# ------------------------------------------------------------------ images: one name each
def _make_default(var: str) -> str:
    m = re.search(rf"^{var} \?= (.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert m, var
    return m.group(1)


def test_the_makefile_reads_the_image_name_from_the_manifests() -> None:
    import subprocess

    assert _make_default("IMAGE") == "$(shell deploy/images.sh current)"
    assert _make_default("IMAGE_TRAIN") == "$(IMAGE)-train"
    current = subprocess.run([str(DEPLOY / "images.sh"), "current"], capture_output=True,
                             text=True, timeout=30, check=True).stdout.strip()
    assert current == _yaml("ray_cluster.yaml")["docker"]["image"]
    proc = subprocess.run([str(DEPLOY / "images.sh"), "check", current, f"{current}-train"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


def test_images_set_rewrites_every_manifest_and_check_then_passes(tmp_path: Path) -> None:
    import shutil
    import subprocess

    copy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, copy)
    script = copy / "images.sh"
    new, new_train = "registry.example/me/rs:2", "registry.example/me/rs:2-train"
    bad = subprocess.run([str(script), "check", new, new_train], capture_output=True, text=True,
                         timeout=30)
    assert bad.returncode == 1 and "rayjob.yaml: image" in bad.stderr
    done = subprocess.run([str(script), "set", new, new_train], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    (job,) = [d for d in yaml.safe_load_all((copy / "kuberay/rayjob.yaml").read_text())]
    assert {c["image"] for _, c in _containers(job)} == {new_train}
    assert yaml.safe_load((copy / "ray_cluster.yaml").read_text())["docker"]["image"] == new
    for doc in yaml.safe_load_all((copy / "kuberay/rayservice.yaml").read_text()):
        if doc["kind"] in ("RayService", "Deployment"):
            assert {c["image"] for _, c in _containers(doc)} == {new}
    # set once: what `make image` / `make image-push` use from then on (the Makefile's IMAGE)
    current = subprocess.run([str(script), "current"], capture_output=True, text=True, timeout=30)
    assert current.stdout.strip() == new


def test_the_service_layout_deploys_replicas_that_run_the_service_on_their_own_loop() -> None:
    from reward_server.service_deployment import SEPARATE_THREAD_ENV, replica_config

    config = load_config(overrides=[
        "engines={judge: {kind: fake}, nli: {kind: fake}}", "serving.mode=ray",
        "serving.ray.layout=service", "serving.ray.service.max_replicas=3",
        "serving.ray.service.env_vars={HF_HUB_OFFLINE: '1'}"], env={})
    opts = config.serving.ray.service.deployment_options(max_items=None)
    assert "user_config" not in opts and opts["autoscaling_config"]["max_replicas"] == 3
    from reward_server.service_deployment import service_application

    app = service_application(config)
    deployment = app._bound_deployment
    env = deployment.ray_actor_options["runtime_env"]["env_vars"]
    assert env == {SEPARATE_THREAD_ENV: "0", "HF_HUB_OFFLINE": "1"}
    assert deployment.user_config is None
    # the replica hosts its engines itself: its config says so, and it validates
    built = RewardServerConfig.model_validate(replica_config(config))
    assert built.serving.mode == "inprocess" and built.engines == config.engines
