"""``vllm-fleet up`` left running across device calls, for the GPU benchmarks that start it once and
run passes against it in later calls (serve_pairs.py, twin_pairs.py): started in a session of its
own, its PID in W/up.pid, stopped by that PID.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml


def launch_up(w: Path, fleet: dict[str, Any], cpus: set[int] | None) -> None:
    """``vllm-fleet up`` on ``fleet`` (written to W/fleet.yaml), in a session of its own so that it
    outlives one device call, on ``cpus`` where given; its PID in W/up.pid for stop()."""
    path = w / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet))
    fh = open(w / "up.log", "ab")  # noqa: SIM115 - handed to the child
    up = subprocess.Popen([sys.executable, "-m", "vllm_fleet.cli", "up", "-c", str(path)], stdout=fh,
                          stderr=subprocess.STDOUT, start_new_session=True,
                          preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    (w / "up.pid").write_text(str(up.pid))


def placed(w: Path) -> str | None:
    """Where `up` said it placed the gateway and vLLM (gateway.cpus); plain passes run that way."""
    lines = [line.split("CPUs: ", 1)[1] for line in (w / "up.log").read_text(errors="replace").splitlines()
             if "] CPUs: " in line]
    return lines[-1] if lines else None


def stop(w: Path) -> dict[str, Any]:
    """SIGTERM to `up` by W/up.pid, at most 120 s for it to end; then the GPUs' memory in use."""
    pid = int((w / "up.pid").read_text())
    t = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    while time.monotonic() - t < 120:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    return {"stop_s": round(time.monotonic() - t, 1),
            "nvidia_smi": subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv"],
                                         capture_output=True, text=True).stdout}
