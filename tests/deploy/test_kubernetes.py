"""deploy/kubernetes: every core object validated against Kubernetes' OpenAPI schemas
(kubernetes-validate, offline, strict), the ServiceMonitor against the fields the Prometheus
Operator reads, and the wiring: gateway config -> per-model Services -> Deployments with GPUs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from fleetspec.infernet import parse_infernet
from tests.deploy.tools import DEPLOY, tool

KUBE = DEPLOY / "kubernetes"


def objects() -> list[dict[str, Any]]:
    out = []
    for path in sorted(KUBE.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            out += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return out


def find(kind: str, name: str) -> dict[str, Any]:
    [obj] = [o for o in objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def validate(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("kubernetes-validate"), "--strict", *map(str, paths)],
                          capture_output=True, text=True, timeout=120)


def test_core_objects_validate_strictly() -> None:
    paths = [p for p in sorted(KUBE.glob("*.yaml")) if p.name not in ("kustomization.yaml", "servicemonitor.yaml")]
    done = validate(*paths)
    assert done.returncode == 0, done.stdout + done.stderr
    passed = done.stdout.count(" passed for resource ")
    assert passed == len([o for o in objects() if o["kind"] != "ServiceMonitor"]), done.stdout


def test_validator_rejects_a_typo(tmp_path: Path) -> None:
    text = (KUBE / "gateway.yaml").read_text().replace("readinessProbe:", "readynessProbe:")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    done = validate(bad)
    assert done.returncode != 0 and "readynessProbe" in done.stdout + done.stderr


def test_kustomization_lists_every_manifest() -> None:
    listed = yaml.safe_load((KUBE / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in KUBE.glob("*.yaml") if p.name != "kustomization.yaml")


def test_servicemonitor_selects_the_gateway_and_vllm_services() -> None:
    sm = find("ServiceMonitor", "vllm-fleet")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    spec = sm["spec"]
    assert set(spec) <= {"selector", "namespaceSelector", "endpoints", "jobLabel"}
    selected = [o for o in objects() if o["kind"] == "Service"
                and spec["selector"]["matchLabels"].items() <= o["metadata"]["labels"].items()
                and o["metadata"]["namespace"] in spec["namespaceSelector"]["matchNames"]]
    assert {s["metadata"]["name"] for s in selected} == {"vllm-fleet-gateway", "vllm-qwen-14b", "vllm-llama-8b"}
    for endpoint in spec["endpoints"]:
        assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "scheme"}
        assert endpoint["path"] == "/metrics"
        for svc in selected:
            assert endpoint["port"] in {p["name"] for p in svc["spec"]["ports"]}


def test_gateway_config_points_at_model_services_backed_by_gpu_deployments() -> None:
    cm = find("ConfigMap", "vllm-fleet-gateway")
    specs, _ = parse_infernet(json.loads(cm["data"]["config.json"]), "configmap")
    assert [s.models for s in specs] == [["qwen2.5:14b"], ["llama3.1:8b"]]
    for spec in specs:
        host, port = spec.url.removeprefix("http://").split(":")
        name, namespace = host.split(".")[:2]
        svc = find("Service", name)
        assert svc["metadata"]["namespace"] == namespace
        assert int(port) in [p["port"] for p in svc["spec"]["ports"]]
        dep = find("Deployment", name)
        assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
        [c] = dep["spec"]["template"]["spec"]["containers"]
        args = c["args"]
        assert args[args.index("--served-model-name") + 1] == spec.models[0]
        tp = args[args.index("--tensor-parallel-size") + 1]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == tp == c["resources"]["requests"]["nvidia.com/gpu"]
        assert c["startupProbe"]["httpGet"]["path"] == "/health"
        assert dep["spec"]["strategy"]["type"] == "Recreate"
    gw = find("Deployment", "vllm-fleet-gateway")
    [c] = gw["spec"]["template"]["spec"]["containers"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready" and c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert {"name": "config", "mountPath": "/etc/vllm-fleet", "readOnly": True} in c["volumeMounts"]
