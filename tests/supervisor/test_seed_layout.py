"""Seed 001's layout end to end on this CPU host: `vllm-fleet plan` writes the fleet file for three
models on four (faked) GPUs, and `vllm-fleet up` runs it with the fake vLLM as ``vllm_command`` and
the real gateway in front. The fake GPUs are a stand-in ``nvidia-smi`` first on PATH (NVML has no
driver here, so discovery falls back to it) in every process: `plan`, `up`, and what they start.

Shown: each instance gets its own CUDA_VISIBLE_DEVICES (0,1 / 2,3 / 2,3); the third model starts
asleep; a request for it swaps it with the second while the first keeps serving, 0 requests
failed; a SIGKILLed API server of the first comes back while the second keeps serving, 0 failed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.planner.test_side_by_side import SEED, llama, model_dir
from tests.supervisor.conftest import REPO, Reaper, fleet_doc, free_port, wait_until
from tests.supervisor.test_up import Up, write

pytestmark = pytest.mark.timeout(120)

FAKE_SMI = """#!/bin/sh
# What `nvidia-smi --query-gpu=index,name,uuid,memory.total,memory.used --format=csv,noheader,nounits`
# prints on a host with four H200s.
for i in 0 1 2 3; do echo "$i, NVIDIA H200, GPU-000$i, 143771, 0"; done
"""
Q, L, M = "qwen2.5-14b", "llama3.1-8b", "mistral-7b"


def fake_gpu_env(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "FLEET_HEALTH_INTERVAL_S": "0.2"}


def planned(tmp_path: Path, env: dict[str, str]) -> dict[str, Any]:
    """`vllm-fleet plan` for the seed layout, as a process that finds the GPUs itself."""
    import subprocess

    argv = [sys.executable, "-m", "vllm_fleet.cli", "plan", "--context", "2048"]
    for name, layers, served in SEED:
        argv += ["--model", model_dir(tmp_path, name, llama(layers)), "--served-name", served]
    argv += ["--asleep", "--fleet-file", str(tmp_path / "planned.yaml")]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    assert "4 × 140.4 GiB (NVIDIA H200) [NVML]" in done.stdout  # the fake nvidia-smi's GPUs
    doc: dict[str, Any] = yaml.safe_load((tmp_path / "planned.yaml").read_text())
    return doc


def on_this_host(tmp_path: Path, plan: dict[str, Any]) -> dict[str, Any]:
    """The planned file with what this shared test host needs: the fake vLLM, free ports, short
    timings, state under tmp_path. Instances keep the planned GPUs, sizes, budgets and sleep blocks."""
    doc = fleet_doc(tmp_path, [], metrics_port=free_port())
    del doc["gateway_command"]  # the real gateway
    doc["swap"] = {**plan["swap"], "hold_s": 1}
    doc["instances"] = [{**inst, "port": free_port()} for inst in plan["instances"]]
    busy = str(tmp_path / "gpus-2-3.busy")  # the fakes on GPUs 2,3 die if their memory operations overlap
    for inst in doc["instances"]:
        inst["vllm_args"] = [*inst["vllm_args"], "--fake-workers", "1", "--fake-startup-delay", "0.3"]
        if inst["gpus"] == [2, 3]:
            inst["vllm_args"] += ["--fake-memory-file", busy, "--fake-sleep-delay", "0.2", "--fake-wake-delay", "0.2"]
    return doc


class Fleet:
    def __init__(self, up: Up, doc: dict[str, Any]) -> None:
        self.up = up
        self.gw = f"http://127.0.0.1:{doc['gateway']['port']}"
        self.sup = f"http://127.0.0.1:{doc['supervisor']['metrics_port']}"
        self.ports = {i["name"]: i["port"] for i in doc["instances"]}

    def children(self) -> dict[str, dict[str, Any]]:
        return {i["name"]: i for i in self.up.instances(self.sup)}

    def states(self) -> dict[str, str]:
        return {n: i["state"] for n, i in self.children().items()}

    def chat(self, model: str) -> httpx.Response:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        return httpx.post(f"{self.gw}/v1/chat/completions", json=body, timeout=60)

    def stats(self, name: str) -> dict[str, int]:
        return dict(httpx.get(f"http://127.0.0.1:{self.ports[name]}/_fake/stats", timeout=5).json())


@contextmanager
def load(fleet: Fleet, model: str) -> Iterator[list[str]]:
    """Requests for ``model`` back to back while the block runs; yields the outcomes ("200", or why not)."""
    outcomes: list[str] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                outcomes.append(str(fleet.chat(model).status_code))
            except httpx.HTTPError as e:
                outcomes.append(repr(e))

    t = threading.Thread(target=loop)
    t.start()
    try:
        wait_until(lambda: len(outcomes) >= 3, 15, f"{model} served under load")
        yield outcomes
    finally:
        stop.set()
        t.join(60)


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def test_seed_layout_swaps_the_sleeper_while_the_first_group_serves(tmp_path: Path, reaper: Reaper,
                                                                   up_procs: list[Up]) -> None:
    env = fake_gpu_env(tmp_path)
    plan = planned(tmp_path, env)
    assert [(i["name"], i["gpus"], i["tensor_parallel_size"], i.get("sleep")) for i in plan["instances"]] == [
        (Q, [0, 1], 2, None), (L, [2, 3], 2, {"preload": True}), (M, [2, 3], 2, {})]
    doc = on_this_host(tmp_path, plan)
    path = write(tmp_path, doc)
    up = Up([sys.executable, "-m", "vllm_fleet.cli", "up", "-c", str(path)], tmp_path, reaper, env=env)
    up_procs.append(up)
    f = Fleet(up, doc)
    want = {Q: "RUNNING", L: "RUNNING", M: "SLEEPING", "gateway": "RUNNING"}
    wait_until(lambda: f.states() == want, 60, f"start-up states {want} (got {f.states()})")
    out = up.output()
    assert out.index(f"{M}: DRAINING -> SLEEPING") < out.index(f"{L}: STOPPED -> STARTING"), \
        "the instances on GPUs 2,3 load one at a time"

    # Each instance sees its own group of the (faked) GPUs, as vLLM would through CUDA.
    children = f.children()
    for name, devices in ((Q, "0,1"), (L, "2,3"), (M, "2,3")):
        e = environ(children[name]["pid"])
        assert (e["CUDA_VISIBLE_DEVICES"], e["CUDA_DEVICE_ORDER"]) == (devices, "PCI_BUS_ID"), name
    assert "--tensor-parallel-size 2" in " ".join(Path(f"/proc/{children[Q]['pid']}/cmdline").read_text().split("\0"))
    fleet = httpx.get(f"{f.gw}/fleet", timeout=5).json()
    assert fleet["vram_tier"] == ">=48gb"
    assert {b["name"]: (b["vram_tier"], b["supervisor_state"]) for b in fleet["backends"]} == {
        Q: (">=48gb", "RUNNING"), L: (">=48gb", "RUNNING"), M: (">=48gb", "SLEEPING")}
    infernet = json.loads((tmp_path / "state" / "infernet.json").read_text())
    assert infernet["served_models"] == ["qwen2.5:14b", "llama3.1:8b", "mistral:7b"]

    # A request for the sleeper swaps it with the second model; the first keeps serving throughout.
    with load(f, "qwen2.5:14b") as first:
        r = f.chat("mistral:7b")
        assert r.status_code == 200 and r.headers["x-fleet-backend"] == M
        assert f.states() == {Q: "RUNNING", L: "SLEEPING", M: "RUNNING", "gateway": "RUNNING"}
        r = f.chat("llama3.1:8b")  # and back
        assert r.status_code == 200 and r.headers["x-fleet-backend"] == L
        assert f.states() == {Q: "RUNNING", L: "RUNNING", M: "SLEEPING", "gateway": "RUNNING"}
    assert first and set(first) == {"200"}, f"the first group failed requests during the swap: {first[:5]}"
    metrics = httpx.get(f"{f.sup}/metrics", timeout=5).text
    assert 'fleet_swaps_total{reason="swap"} 2.0' in metrics
    assert 'fleet_wake_seconds_count{instance="mistral-7b",mode="vllm"} 1.0' in metrics

    # SIGKILL the first instance's API server: it comes back, and the second keeps serving throughout.
    old = children[Q]["pid"]
    with load(f, "llama3.1:8b") as second:
        os.kill(old, signal.SIGKILL)
        wait_until(lambda: f.children()[Q]["pid"] != old and f.states()[Q] == "RUNNING", 30, "the first back")
        wait_until(lambda: f.chat("qwen2.5:14b").status_code == 200, 15, "the first served again")
    assert second and set(second) == {"200"}, f"the second group failed requests: {second[:5]}"
    assert f.children()[Q]["restarts"] == 1
    for name in (L, M):
        assert f.stats(name)["while_asleep"] == 0, f"a request reached {name} while it slept"
    for name in f.ports:
        assert f"[{name}] " in up.output()
    assert "Memory usage increased" not in up.output(), "memory operations on GPUs 2,3 overlapped"

    up.proc.send_signal(signal.SIGTERM)
    assert up.proc.wait(30) == 0, up.output()[-3000:]
    wait_until(lambda: reaper.alive() == [], 10, "no process left")
