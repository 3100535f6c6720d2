"""A real Prometheus (Debian's package) scrapes a running `vllm-fleet up` (its real gateway and
supervisor, fake vLLM instances) with the shipped alert rules loaded, and the test reads the
series and rules back through Prometheus' HTTP API."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.deploy.tools import DEPLOY, tool
from tests.supervisor.conftest import fleet_doc
from tests.support.procs import Proc, free_port, wait_http, wait_until

pytestmark = pytest.mark.timeout(120)


def query(prom: str, expr: str) -> list[dict[str, Any]]:
    body = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=5).json()
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def test_prometheus_scrapes_gateway_supervisor_and_vllm(tmp_path: Path) -> None:
    prometheus = tool("prometheus")
    sup_port = free_port()
    doc = fleet_doc(tmp_path, [{"name": "a", "model": "m-a"}, {"name": "b", "model": "m-b"}],
                    metrics_port=sup_port, health_interval_s=0.5)
    del doc["gateway_command"]  # the real gateway: python -m gateway -c {config}
    gw = f"127.0.0.1:{doc['gateway']['port']}"
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(yaml.safe_dump(doc))

    shutil.copy(DEPLOY / "prometheus" / "alerts.yml", tmp_path / "alerts.yml")
    vllm_targets = [f"127.0.0.1:{inst['port']}" for inst in doc["instances"]]
    # The shipped config with its DNS discovery (compose service names) swapped for loopback
    # targets; everything else (honor_labels, rule files) as shipped.
    cfg = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    cfg["global"].update(scrape_interval="1s", evaluation_interval="1s")
    local = {"fleet-gateway": [gw], "fleet-supervisor": [f"127.0.0.1:{sup_port}"], "vllm": vllm_targets}
    cfg["scrape_configs"] = [{**{k: v for k, v in job.items() if k != "dns_sd_configs"},
                              "static_configs": [{"targets": local[job["job_name"]]}]}
                             for job in cfg["scrape_configs"] if job["job_name"] in local]
    assert cfg["rule_files"] == ["alerts.yml"] and len(cfg["scrape_configs"]) == 3
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    prom_port = free_port()
    prom = f"http://127.0.0.1:{prom_port}"
    env = {"FLEET_HEALTH_INTERVAL_S": "0.2", "FLEET_HEALTH_SUCCESSES": "1"}
    up = Proc([sys.executable, "-m", "vllm_fleet.cli", "up", "-c", str(fleet_file)], tmp_path / "up.log", env)
    server = None
    try:
        wait_http(f"http://{gw}/ready", up, timeout=60)

        def all_healthy() -> bool:
            backends = httpx.get(f"http://{gw}/fleet", timeout=5).json()["backends"]
            return len(backends) == 2 and all(b["healthy"] for b in backends)
        assert wait_until(all_healthy, timeout=20), up.tail()

        def chat(model: str) -> None:
            r = httpx.post(f"http://{gw}/v1/chat/completions", timeout=10,
                           json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
            assert r.status_code == 200, r.text

        # One request per model first: a labelled series is born with its first value, and rate()
        # only sees increases after Prometheus has a sample of the series.
        chat("m-a")
        chat("m-b")
        server = Proc([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                       f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
                      tmp_path / "prometheus.log")
        wait_http(f"{prom}/-/ready", server, timeout=30)
        assert wait_until(lambda: len(query(prom, "up == 1")) == 4, timeout=30), server.tail()
        # Traffic after the first scrapes, so rate() sees the counters move.
        for model in ("m-a", "m-b", "m-a"):
            chat(model)
        ttfb_p95 = ("histogram_quantile(0.95, sum by (model, le) "
                    "(rate(fleet_time_to_first_byte_seconds_bucket[1m]))) > 0")

        def scraped() -> bool:
            total = query(prom, "sum(fleet_requests_total)")
            return bool(total) and total[0]["value"][1] == "5" and len(query(prom, ttfb_p95)) == 2
        assert wait_until(scraped, timeout=30), (query(prom, "sum(fleet_requests_total)"), query(prom, ttfb_p95))

        healthy = {r["metric"]["backend"]: r["value"][1] for r in query(prom, "fleet_backend_healthy")}
        assert healthy == {"a": "1", "b": "1"}
        served = {r["metric"]["model"]: float(r["value"][1])
                  for r in query(prom, 'sum by (model) (fleet_requests_total{code="200"})')}
        assert served == {"m-a": 3.0, "m-b": 2.0}
        running = {r["metric"]["instance"] for r in query(prom, 'fleet_instance_state{state="RUNNING"} == 1')}
        assert running == {"a", "b", "gateway"}
        assert {r["metric"]["instance"] for r in query(prom, "fleet_instance_restarts_total")} == running
        assert len(query(prom, "vllm:num_requests_waiting")) == 2  # the fake's vLLM-named gauges

        def evaluated() -> bool:
            groups = httpx.get(f"{prom}/api/v1/rules", timeout=5).json()["data"]["groups"]
            rules = [r for g in groups for r in g["rules"]]
            return len(rules) == 7 and all(r["health"] == "ok" and r["lastEvaluation"][:4] != "0001" for r in rules)
        assert wait_until(evaluated, timeout=15), httpx.get(f"{prom}/api/v1/rules", timeout=5).text
        # Everything is healthy: nothing fires.
        firing = [a for a in httpx.get(f"{prom}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
                  if a["state"] == "firing"]
        assert firing == []
    finally:
        if server is not None:
            server.stop()
        up.stop(grace=20)
