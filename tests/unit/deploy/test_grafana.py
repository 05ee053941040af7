"""The KubeRay monitoring kustomization: the Grafana dashboard exists once
(deploy/grafana/reward-server.json) and its ConfigMap is generated from that file by kustomize
(deploy/grafana/kustomization.yaml, applied with the PodMonitor by `kubectl apply -k
deploy/kuberay/monitoring`), so the two cannot drift; the PodMonitor scrapes the ingress pods'
metrics port. (tests/integration/test_metrics.py checks every query names a metric the server
exports.)"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "reward-server.json"
GRAFANA_KUSTOMIZATION = DEPLOY / "grafana" / "kustomization.yaml"
MONITORING = DEPLOY / "kuberay" / "monitoring"
RAYSERVICE = DEPLOY / "kuberay" / "rayservice.yaml"


def _docs(path: Path) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in yaml.safe_load_all(path.read_text()) if d}


def test_the_dashboard_is_one_file_in_deploy() -> None:
    uid = json.loads(DASHBOARD.read_text())["uid"]
    holders = [p.relative_to(ROOT) for p in DEPLOY.rglob("*") if p.is_file()
               and p.suffix in (".json", ".yaml", ".yml") and f'"uid": "{uid}"' in p.read_text()]
    assert holders == [DASHBOARD.relative_to(ROOT)], holders


def test_the_configmap_is_generated_from_that_file() -> None:
    k = yaml.safe_load(GRAFANA_KUSTOMIZATION.read_text())
    (gen,) = k["configMapGenerator"]
    assert gen["files"] == [DASHBOARD.name]  # beside it: kustomize reads it as is
    assert gen["options"]["labels"]["grafana_dashboard"] == "1"  # kube-prometheus-stack's sidecar
    assert gen["options"]["disableNameSuffixHash"] is True  # an update replaces, never duplicates
    monitoring = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    assert sorted(monitoring["resources"]) == ["../../grafana", "podmonitor.yaml"]
    assert (MONITORING / monitoring["resources"][1]).resolve() == GRAFANA_KUSTOMIZATION.parent


def test_kubectl_kustomize_renders_the_dashboard_unchanged() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl here (kustomize is built into it): the structure is checked above")
    out = subprocess.run([kubectl, "kustomize", str(MONITORING)], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    docs = {d["kind"]: d for d in yaml.safe_load_all(out)}
    assert set(docs) == {"ConfigMap", "PodMonitor"}
    cm = docs["ConfigMap"]
    assert cm["metadata"]["name"] == "reward-server-grafana-dashboard"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["data"]["reward-server.json"] == DASHBOARD.read_text()  # byte for byte


def test_podmonitor_scrapes_the_ingress_metrics_port() -> None:
    monitor = _docs(MONITORING / "podmonitor.yaml")["PodMonitor"]
    ingress = _docs(RAYSERVICE)["Deployment"]
    labels = ingress["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    ports = {p["name"]: p["containerPort"] for c in ingress["spec"]["template"]["spec"]["containers"]
             for p in c["ports"]}
    config = yaml.safe_load(_docs(RAYSERVICE)["ConfigMap"]["data"]["config.yaml"])
    assert ports[endpoint["port"]] == config["server"]["metrics_port"]
    assert endpoint["path"] == "/metrics"


def test_dashboard_variables_and_datasource() -> None:
    board = json.loads(DASHBOARD.read_text())
    names = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "job"} <= names
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            assert '$job' in target["expr"], target["expr"]
