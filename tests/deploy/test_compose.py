"""docker-compose.yml: valid for Compose (docker-compose config, and the compose-spec schema), and
consistent with the fleet file, the split layout's Infernet JSON and the Dockerfile's pin."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetspec.fleetfile import load_fleet
from fleetspec.infernet import parse_infernet
from tests.deploy.tools import DEPLOY, REPO, tool

COMPOSE = REPO / "docker-compose.yml"


def compose_config(*args: str) -> dict[str, Any]:
    """The file as Compose resolves it (anchors, merges, profiles); needs no Docker engine."""
    done = subprocess.run([tool("docker-compose"), "-f", str(COMPOSE), *args, "config"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = yaml.safe_load(done.stdout)
    return doc


def raw() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return doc


def test_docker_compose_config_accepts_both_layouts() -> None:
    default = compose_config()
    split = compose_config("--profile", "split")
    assert {"fleet", "prometheus", "grafana", "dcgm-exporter"} <= set(default["services"])
    assert {"vllm-qwen-14b", "vllm-llama-8b", "gateway-split"} <= set(split["services"])
    assert split["services"]["gateway-split"]["ports"][0]["target"] == 8080


def test_compose_spec_schema() -> None:
    done = subprocess.run([tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def devices(service: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = service["deploy"]["resources"]["reservations"]["devices"]
    return out


def test_fleet_service_reserves_exactly_the_fleet_files_gpus() -> None:
    services = raw()["services"]
    fleet = load_fleet(DEPLOY / "compose" / "fleet.yaml")
    [dev] = devices(services["fleet"])
    assert dev["driver"] == "nvidia" and dev["capabilities"] == ["gpu"]
    assert sorted(int(i) for i in dev["device_ids"]) == sorted(g for inst in fleet.instances for g in inst.gpus)
    assert "./deploy/compose/fleet.yaml:/etc/vllm-fleet/fleet.yaml:ro" in services["fleet"]["volumes"]
    assert any(v.startswith("hf-cache:") for v in services["fleet"]["volumes"])
    assert services["fleet"]["ports"] == ["8080:8080"]
    # Prometheus scrapes the supervisor from another container.
    assert fleet.supervisor.metrics_host == "0.0.0.0" and fleet.supervisor.metrics_port == 9400
    # Compose's SIGKILL must come after the supervisor's own stop: gateway, then instances.
    grace = int(services["fleet"]["stop_grace_period"].rstrip("s"))
    assert grace > 2 * fleet.supervisor.stop_grace_s


def vllm_flag(service: dict[str, Any], flag: str) -> str:
    cmd = [str(c) for c in service["command"]]
    return cmd[cmd.index(flag) + 1]


def test_split_layout_matches_its_infernet_json() -> None:
    services = raw()["services"]
    path = DEPLOY / "compose" / "infernet-split.json"
    specs, _ = parse_infernet(json.loads(path.read_text()), str(path))
    assert [s.models for s in specs] == [["qwen2.5:14b"], ["llama3.1:8b"]]
    expected = {"vllm-qwen-14b": ("Qwen/Qwen2.5-14B-Instruct", ["0", "1"]),
                "vllm-llama-8b": ("meta-llama/Llama-3.1-8B-Instruct", ["2", "3"])}
    for spec in specs:
        host, port = re.fullmatch(r"http://([a-z0-9-]+):(\d+)", spec.url).groups()  # type: ignore[union-attr]
        svc = services[host]
        assert svc["profiles"] == ["split"]
        model, ids = expected[host]
        assert vllm_flag(svc, "--model") == model
        assert vllm_flag(svc, "--port") == port and vllm_flag(svc, "--host") == "0.0.0.0"
        assert vllm_flag(svc, "--served-model-name") == spec.models[0]
        [dev] = devices(svc)
        assert dev["device_ids"] == ids and vllm_flag(svc, "--tensor-parallel-size") == str(len(ids))
    assert "./deploy/compose/infernet-split.json:/etc/vllm-fleet/config.json:ro" in services["gateway-split"]["volumes"]


def test_images_pin_the_dockerfiles_vllm_release() -> None:
    pin = re.search(r"^ARG VLLM_IMAGE=(\S+)$", (REPO / "Dockerfile").read_text(), re.M)
    assert pin is not None
    for name, svc in raw()["services"].items():
        image = svc.get("image", "")
        assert ":" in image and not image.endswith(":latest"), f"{name}: unpinned image {image!r}"
        if image.startswith("vllm/vllm-openai"):
            assert image == pin.group(1), name
    kube = [p.read_text() for p in (DEPLOY / "kubernetes").glob("vllm-*.yaml")]
    assert kube and all(f"image: {pin.group(1)}" in text for text in kube)


@pytest.mark.parametrize("mount", ["./deploy/prometheus/prometheus.yml", "./deploy/prometheus/alerts.yml",
                                   "./deploy/grafana/provisioning", "./deploy/grafana/dashboards"])
def test_mounted_files_exist(mount: str) -> None:
    assert (REPO / mount).exists()
    services = raw()["services"]
    assert any(v.startswith(mount + ":") for s in services.values() for v in s.get("volumes", []))


def test_dockerignore_keeps_the_build_context_small() -> None:
    ignored = set((REPO / ".dockerignore").read_text().split())
    assert {".venv", ".fleet", "logs", "bench/results", ".git"} <= ignored
    assert not Path(REPO / ".dockerignore").read_text().count("gateway")
