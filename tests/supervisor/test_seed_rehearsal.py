"""The GPU script for Seed 001's layout (bench/gpu/seed_run.sh → seed_layout.py) rehearsed here, so
that the run on a lent nvidia-h200-x4 does not fail on the script: every phase, in the calls the
script's header gives, with fake vLLMs on four GPUs that a stand-in nvidia-smi reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.supervisor.conftest import REPO, Reaper

pytestmark = pytest.mark.timeout(300)
SCRIPT = REPO / "bench" / "gpu" / "seed_layout.py"


def phases(out: Path, reaper: Reaper, *args: str) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), *args, "--out", str(out), "--deadline-s", "200"], cwd=REPO,
                          capture_output=True, text=True, timeout=260, env={**_env(), **reaper.env()})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}


def result(out: Path, phase: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / f"{phase}.json").read_text())
    assert data["ok"], data
    return data


def test_every_phase_of_the_gpu_script_runs(tmp_path: Path, reaper: Reaper) -> None:
    out = tmp_path / "seed-run"
    phases(out, reaper, "prepare", "start", "--rehearse")
    phases(out, reaper, "wait", "measure", "--rounds", "1")
    phases(out, reaper, "orphan", "stop")
    prepare = result(out, "prepare")
    assert prepare["planned_layout"] == [["qwen2.5-14b", [0, 1], 2, None],
                                         ["llama3.1-8b", [2, 3], 2, {"preload": True}], ["mistral-7b", [2, 3], 2, {}]]
    assert prepare["check_rc"] == 0 and "CUDA_VISIBLE_DEVICES=2,3" in prepare["check"]
    start = result(out, "start")
    assert start["start_order"].index("mistral-7b") < start["start_order"].index("llama3.1-8b")
    measure = result(out, "measure")
    assert measure["isolation_ok"], measure["placement"]
    assert measure["tiers"] == {"node": ">=48gb", "instances": {"qwen2.5-14b": ">=48gb", "llama3.1-8b": ">=48gb",
                                                               "mistral-7b": ">=48gb"}}
    assert measure["first_group_during_swaps"]["failed"] == 0 and measure["first_group_during_swaps"]["ok"] > 0
    assert [w["model"] for w in measure["wakes"]] == ["mistral:7b", "llama3.1:8b"]
    assert all(w["ttft_s"] is not None for w in measure["wakes"])
    orphan = result(out, "orphan")
    assert orphan["second_during_restart"]["failed"] == 0 and orphan["restarts"] == 1
    assert orphan["in_rotation_s"] >= orphan["respawned_s"]
    stop = result(out, "stop")
    assert stop["up_alive"] is False and stop["left_in_groups"] == {}
    assert reaper.alive() == []
