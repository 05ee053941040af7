"""The KubeRay monitoring manifests: the Grafana dashboard ConfigMap holds the shipped dashboard
(deploy/grafana/reward-server.json) unchanged, and the PodMonitor scrapes the ingress pods' metrics
port. (tests/integration/test_metrics.py checks every query names a metric the server exports.)"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "reward-server.json"
MONITORING = ROOT / "deploy" / "kuberay" / "monitoring.yaml"
RAYSERVICE = ROOT / "deploy" / "kuberay" / "rayservice.yaml"


def _docs(path: Path) -> dict[str, dict]:  # type: ignore[type-arg]
    return {d["kind"]: d for d in yaml.safe_load_all(path.read_text()) if d}


def test_configmap_holds_the_dashboard() -> None:
    cm = _docs(MONITORING)["ConfigMap"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["reward-server.json"]) == json.loads(DASHBOARD.read_text()), (
        "deploy/kuberay/monitoring.yaml's ConfigMap differs from deploy/grafana/reward-server.json:"
        " paste the JSON (indented 4 spaces) under `reward-server.json: |`")


def test_podmonitor_scrapes_the_ingress_metrics_port() -> None:
    monitor = _docs(MONITORING)["PodMonitor"]
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
