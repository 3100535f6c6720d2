"""``vllm-fleet up`` as a real subprocess: start, supervise, stop on a signal, leave nothing."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.supervisor.conftest import REPO, Reaper, fleet_doc, free_port, group_alive, pgid_of, wait_until

pytestmark = pytest.mark.timeout(90)


class Up:
    """One `up` process in its own process group, killed with its group in teardown whatever happens."""

    def __init__(self, argv: list[str], tmp_path: Path, reaper: Reaper, env: dict[str, str] | None = None) -> None:
        self.out = tmp_path / "up.out"
        clean = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
        # cwd=REPO: this checkout's packages come first on sys.path, as for a developer.
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                         env={**clean, **reaper.env(), **(env or {})}, process_group=0)
        reaper.pgids.add(self.proc.pid)

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def instances(self, url: str) -> list[dict[str, Any]]:
        try:
            body: dict[str, Any] = httpx.get(f"{url}/instances", timeout=2).json()
        except httpx.HTTPError:
            return []
        return list(body["instances"])

    def wait_running(self, url: str, timeout: float = 30) -> list[dict[str, Any]]:
        def ready() -> bool:
            assert self.proc.poll() is None, self.output()
            found = self.instances(url)
            return bool(found) and all(i["state"] == "RUNNING" for i in found)
        wait_until(ready, timeout, "every child RUNNING")
        return self.instances(url)


def write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def start_up(tmp_path: Path, doc: dict[str, Any], reaper: Reaper) -> tuple[Up, str, str]:
    """`up` on ``doc`` (written to tmp_path/fleet.yaml), its gateway probing every 0.5 s and one
    success enough, as the real-vLLM tests run it: (it, the gateway's URL, the supervisor's)."""
    up = Up([sys.executable, "-m", "vllm_fleet.cli", "up", "-c", str(write(tmp_path, doc))], tmp_path, reaper,
            env={"FLEET_HEALTH_INTERVAL_S": "0.5", "FLEET_HEALTH_SUCCESSES": "1"})
    return up, f"http://127.0.0.1:{doc['gateway']['port']}", f"http://127.0.0.1:{doc['supervisor']['metrics_port']}"


def stop_leaves_nothing(up: Up, sup: str, reaper: Reaper) -> None:
    """SIGTERM on `up`: it exits 0, every child's group is gone, and no process of the test is left."""
    pgids = {c["pid"] for c in up.instances(sup)}
    up.proc.send_signal(signal.SIGTERM)
    assert up.proc.wait(90) == 0, up.output()[-3000:]
    for pgid in pgids:
        assert not group_alive(pgid)
    assert reaper.alive() == []


def test_up_then_sigterm_stops_everything(tmp_path: Path, reaper: Reaper, up_procs: list[Up]) -> None:
    metrics = free_port()
    doc = fleet_doc(tmp_path, [
        {"name": "a", "model": "m-a", "vllm_args": ["--fake-workers", "2", "--fake-startup-delay", "1.2"]},
        {"name": "b", "model": "m-b", "served_model_names": ["b1", "b2"], "vllm_args": ["--fake-workers", "1"]},
    ], metrics_port=metrics, progress_interval_s=0.4)
    up = Up([sys.executable, "-m", "vllm_fleet.cli", "up", "-c", str(write(tmp_path, doc))], tmp_path, reaper)
    up_procs.append(up)
    url = f"http://127.0.0.1:{metrics}"
    children = up.wait_running(url)
    assert [c["name"] for c in children] == ["a", "b", "gateway"]
    pgids = {c["pid"] for c in children}
    def descendants() -> list[int]:
        return [p for p in reaper.alive() if p != up.proc.pid]

    wait_until(lambda: len(descendants()) == 3 + 3, 10, "3 children + 3 workers")
    pgids |= {g for g in map(pgid_of, descendants()) if g is not None}
    assert len(pgids) == 3, "each child leads its own group; workers stay in their parent's"

    text = httpx.get(f"{url}/metrics").text
    for name in ("a", "b", "gateway"):
        assert f'fleet_instance_state{{instance="{name}",state="RUNNING"}} 1.0' in text
        assert f'fleet_instance_restarts_total{{instance="{name}"}} 0.0' in text
    infernet = json.loads((tmp_path / "state" / "infernet.json").read_text())
    assert infernet["served_models"] == ["m-a", "b1", "b2"]

    up.proc.send_signal(signal.SIGTERM)
    assert up.proc.wait(30) == 0, up.output()
    for pgid in pgids:
        assert not group_alive(pgid), f"group {pgid} still has members"
    assert reaper.alive() == []
    out = up.output()
    assert "[a] fake vllm" in out and "[b] fake vllm" in out
    assert "loading: a STARTING" in out and "ready in" in out and "stopped; no process left" in out
    assert out.index("gateway: STOPPING -> STOPPED") < out.index("a: RUNNING -> STOPPING")
    assert "fake vllm" in (tmp_path / "logs" / "b.log").read_text()


@pytest.mark.skipif(importlib.util.find_spec("gateway.main") is None, reason="the gateway package is not there yet")
def test_python_m_supervisor_with_the_real_gateway(tmp_path: Path, reaper: Reaper, up_procs: list[Up]) -> None:
    """Clients reach both instances through the gateway; a SIGKILLed instance comes back; Ctrl-C ends all."""
    metrics = free_port()
    doc = fleet_doc(tmp_path, [
        {"name": "a", "model": "m-a", "vllm_args": ["--fake-workers", "1"]},
        {"name": "b", "model": "m-b", "served_model_names": ["b1", "b2"]},
    ], metrics_port=metrics)
    del doc["gateway_command"]  # the default: python -m gateway -c {config}
    up = Up([sys.executable, "-m", "fleet_supervisor", "-c", str(write(tmp_path, doc))], tmp_path, reaper,
            env={"FLEET_HEALTH_INTERVAL_S": "0.2"})
    up_procs.append(up)
    url = f"http://127.0.0.1:{metrics}"
    children = up.wait_running(url)
    gw = f"http://127.0.0.1:{doc['gateway']['port']}"

    def chat(model: str) -> int:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        try:
            return httpx.post(f"{gw}/v1/chat/completions", json=body, timeout=5).status_code
        except httpx.HTTPError:
            return 0

    wait_until(lambda: chat("m-a") == 200 and chat("b2") == 200, 15, "both models through the gateway")
    a_pid = children[0]["pid"]
    t0 = time.monotonic()
    os.kill(a_pid, signal.SIGKILL)
    wait_until(lambda: any(c["name"] == "a" and c["state"] == "RUNNING" and c["pid"] != a_pid
                           for c in up.instances(url)), 20, "a restarted")
    wait_until(lambda: chat("m-a") == 200, 15, "a served again through the gateway")
    print(f"\nSIGKILL -> served again through the gateway: {time.monotonic() - t0:.2f}s")
    pgids = {g for g in map(pgid_of, reaper.alive()) if g is not None} - {up.proc.pid}
    assert len(pgids) == 3

    up.proc.send_signal(signal.SIGINT)
    assert up.proc.wait(30) == 0, up.output()
    assert all(not group_alive(g) for g in pgids)
    assert reaper.alive() == []


def test_second_signal_cuts_the_grace_period_short(tmp_path: Path, reaper: Reaper, up_procs: list[Up]) -> None:
    metrics = free_port()
    doc = fleet_doc(tmp_path, [{"name": "stubborn", "model": "m", "vllm_args": ["--fake-ignore-sigterm"]}],
                    metrics_port=metrics, stop_grace_s=60)
    up = Up([sys.executable, "-m", "vllm_fleet.cli", "up", "-c", str(write(tmp_path, doc))], tmp_path, reaper)
    up_procs.append(up)
    children = up.wait_running(f"http://127.0.0.1:{metrics}")
    up.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: "stubborn: RUNNING -> STOPPING" in up.output(), 10, "the instance to be stopping")
    time.sleep(0.3)
    assert up.proc.poll() is None, "SIGTERM is ignored: it waits for the grace period"
    t0 = time.monotonic()
    up.proc.send_signal(signal.SIGTERM)
    assert up.proc.wait(10) == 0, up.output()
    assert time.monotonic() - t0 < 10
    assert all(not group_alive(c["pid"]) for c in children) and reaper.alive() == []
