"""Prometheus config and rules (promtool), the Grafana dashboard and its provisioning, and every
metric name they use checked against what the gateway, the supervisor and vLLM export."""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

import yaml

from tests.deploy.tools import DEPLOY, REPO, metric_names_in, tool, unknown_metrics, vllm_metric_names

PROM = DEPLOY / "prometheus"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "vllm-fleet.json"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("promtool"), *args], capture_output=True, text=True, timeout=60)


def test_promtool_check_config() -> None:
    done = promtool("check", "config", str(PROM / "prometheus.yml"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 rule files found" in done.stdout


def test_promtool_check_rules() -> None:
    done = promtool("check", "rules", str(PROM / "alerts.yml"))
    assert done.returncode == 0, done.stdout + done.stderr


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((PROM / "alerts.yml").read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def test_alerts_cover_the_failure_modes() -> None:
    by_name = {r["alert"]: r["expr"] for r in rules()}
    wanted = {
        "FleetBackendDown": "fleet_backend_healthy",
        "FleetInstanceFatal": 'fleet_instance_state{state="FATAL"}',
        "FleetInstanceRestarting": "fleet_instance_restarts_total",
        "FleetTTFTHigh": "fleet_time_to_first_byte_seconds_bucket",
        "VllmQueueGrowing": "vllm:num_requests_waiting",
        "VllmKvCacheNearlyFull": "vllm:kv_cache_usage_perc",
    }
    for alert, metric in wanted.items():
        assert metric in by_name[alert], alert
    assert "0.95" in by_name["FleetTTFTHigh"]


def test_alert_metrics_exist() -> None:
    assert unknown_metrics([r["expr"] for r in rules()]) == []


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def test_dashboard_metrics_exist() -> None:
    assert len(exprs()) >= 20
    assert unknown_metrics(exprs()) == []


def test_dashboard_covers_the_required_panels() -> None:
    used = set().union(*(metric_names_in(e) for e in exprs()))
    required = {
        "fleet_requests_total",                              # requests and errors
        "fleet_time_to_first_byte_seconds_bucket", "vllm:time_to_first_token_seconds_bucket",  # TTFT
        "fleet_request_duration_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",    # latency
        "vllm:generation_tokens_total", "vllm:prompt_tokens_total",                           # tokens/s
        "fleet_backend_in_flight", "vllm:kv_cache_usage_perc", "fleet_instance_restarts_total",
        "DCGM_FI_DEV_FB_USED",                               # GPU memory
    }
    assert required <= used, required - used
    quantiles = {q for e in exprs() for q in re.findall(r"histogram_quantile\((0\.\d+)", e)}
    assert {"0.5", "0.95", "0.99"} <= quantiles


def test_the_checker_rejects_a_wrong_name() -> None:
    # The check is not vacuous: a typo, a gateway metric without its suffix, a vLLM counter
    # without _total and a label the metric lacks are all reported.
    assert "vllm:generation_tokens_total" in vllm_metric_names()
    bad = ['rate(fleet_request_total[5m])', 'fleet_retries', 'rate(vllm:generation_tokens[1m])',
           'fleet_backend_healthy{model="x"}']
    assert len(unknown_metrics(bad)) == 4


def test_dashboard_panels_are_well_formed() -> None:
    doc = dashboard()
    assert doc["uid"] == "vllm-fleet"
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    [var] = doc["templating"]["list"]
    assert var["type"] == "datasource" and var["query"] == "prometheus"
    for p in doc["panels"]:
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]


def test_grafana_provisioning_points_at_the_mounted_paths() -> None:
    prov = DEPLOY / "grafana" / "provisioning"
    [ds] = yaml.safe_load((prov / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"
    [provider] = yaml.safe_load((prov / "dashboards" / "vllm-fleet.yml").read_text())["providers"]
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    grafana = compose["services"]["grafana"]
    assert f"./deploy/grafana/dashboards:{provider['options']['path']}:ro" in grafana["volumes"]
    assert "./deploy/grafana/provisioning:/etc/grafana/provisioning:ro" in grafana["volumes"]


def test_scrape_config_reaches_every_exporter() -> None:
    cfg = yaml.safe_load((PROM / "prometheus.yml").read_text())
    targets = {(job["job_name"], name, sd["port"])
               for job in cfg["scrape_configs"] for sd in job["dns_sd_configs"] for name in sd["names"]}
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    for _, name, _ in targets:
        assert name in compose, name
    assert ("fleet-gateway", "fleet", 8080) in targets and ("fleet-gateway", "gateway-split", 8080) in targets
    assert ("fleet-supervisor", "fleet", 9400) in targets
    fleet = yaml.safe_load((DEPLOY / "compose" / "fleet.yaml").read_text())
    for inst in fleet["instances"]:
        assert ("vllm", "fleet", inst["port"]) in targets
        assert "0.0.0.0" in inst["vllm_args"]  # else vLLM only listens on the container's loopback
    assert ("vllm", "vllm-qwen-14b", 8000) in targets and ("dcgm", "dcgm-exporter", 9400) in targets
