"""The state of a Seed 001 run (bench/gpu/seed_layout.py) between device calls: the output folder,
the fleet file's URLs, the supervisor's view of the instances, and the CLI as this run calls it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml
from seed_gpus import GpuView  # beside this file: the script's folder is first on sys.path

REPO = Path(__file__).resolve().parents[2]
MODELS = (("q14", 56, "qwen2.5:14b"), ("l8", 28, "llama3.1:8b"), ("m7", 14, "mistral:7b"))  # 5.6 B, 2.8 B, 1.4 B
SHAPE = ["--hidden", "3072", "--heads", "24", "--kv-heads", "8", "--intermediate", "8192", "--dtype", "bfloat16"]
Q, L, M = "qwen2.5-14b", "llama3.1-8b", "mistral-7b"  # the instance names the plan gives them
ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
       "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
FAKE_SMI = "#!/bin/sh\nfor i in 0 1 2 3; do echo \"$i, NVIDIA H200, GPU-000$i, 143771, 0\"; done\n"
READY = {Q: "RUNNING", L: "RUNNING", M: "SLEEPING", "gateway": "RUNNING"}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Run:
    def __init__(self, out: Path, deadline: float, rehearse: bool) -> None:
        """``rehearse``: prepare a rehearsal; later calls read it from OUT/mode.json."""
        self.out = out
        self.deadline = deadline
        mode = out / "mode.json"
        self.rehearse = rehearse or (json.loads(mode.read_text())["rehearse"] if mode.exists() else False)
        self.gpus = GpuView(self.rehearse)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "vllm_fleet.cli", *args], cwd=REPO, capture_output=True,
                              text=True, timeout=timeout, env=self.env())

    def env(self) -> dict[str, str]:
        path = f"{self.out / 'fake-bin'}{os.pathsep}{os.environ['PATH']}" if self.rehearse else os.environ["PATH"]
        return {**os.environ, **ENV, "PATH": path, "PYTHONUNBUFFERED": "1", "FLEET_HEALTH_INTERVAL_S": "1"}

    def fleet(self) -> dict[str, Any]:
        doc: dict[str, Any] = yaml.safe_load((self.out / "fleet.yaml").read_text())
        return doc

    @property
    def gw(self) -> str:
        return f"http://127.0.0.1:{self.fleet()['gateway']['port']}"

    @property
    def sup(self) -> str:
        return f"http://127.0.0.1:{self.fleet()['supervisor']['metrics_port']}"

    def instances(self) -> dict[str, dict[str, Any]]:
        try:
            return {i["name"]: i for i in httpx.get(self.sup + "/instances", timeout=2).json()["instances"]}
        except (httpx.HTTPError, ValueError, KeyError):
            return {}

    def states(self) -> dict[str, str]:
        return {n: i["state"] for n, i in self.instances().items()}

    def wait(self, cond: Callable[[], bool], timeout: float, what: str) -> float:
        t = time.monotonic()
        limit = min(timeout, self.left())
        while not cond():
            if time.monotonic() - t > limit:
                raise TimeoutError(f"{what}: not within {limit:.0f}s (states {self.states()})")
            time.sleep(0.2)
        return round(time.monotonic() - t, 2)
