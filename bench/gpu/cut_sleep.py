"""The parts of cut_gauges.py that look past vLLM's /metrics after a cut: each API server's own
gauge files, and a sleep and wake of the instance through the admin API, timed at the supervisor
(cut_pair.py times a restart with the same ``States`` and ``up_said``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
from gpu_fleet import GW, base_fleet, fleet_healthy, instances, wait


def gauge_files() -> list[list[Any]]:
    """Each API server's own record of the two gauges: prometheus_client's multiprocess files
    (``gauge_mostrecent_PID.db``), each value with the wall time its process set it. /metrics
    reports the latest of them (mode ``mostrecent``)."""
    from prometheus_client.mmap_dict import MmapedDict  # vLLM's dependency, on the GPU machine

    dirs: set[str] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        dirs |= {e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"PROMETHEUS_MULTIPROC_DIR=")}
    return [[f.name, json.loads(key)[0], value, ts] for d in sorted(dirs) for f in sorted(Path(d).glob("gauge_*.db"))
            for key, value, ts, _ in MmapedDict.read_all_values_from_file(str(f))
            if "num_requests_running" in key or "num_requests_waiting" in key]


def state() -> str | None:
    return instances().get("a", {}).get("state")


def admin(w: Path, action: str) -> int:
    key = Path(base_fleet(w)["supervisor"]["state_dir"], "admin.key").read_text().strip()
    return httpx.post(f"{GW}/admin/instances/a/{action}", headers={"Authorization": f"Bearer {key}"},
                      timeout=30).status_code


class States:
    """Instance a's supervisor states polled from one moment on: each change, in seconds from it."""

    def __init__(self, every: float) -> None:
        self.t = time.monotonic()
        self.every = every
        self.seen: list[list[Any]] = []

    def until(self, want: str, since: float, limit: float, leave: bool = False) -> float | None:
        """Seconds from ``since`` to state ``want`` (with ``leave``: to any state but it)."""
        while time.monotonic() - since < limit:
            st = state()
            if not self.seen or self.seen[-1][0] != st:
                self.seen.append([st, round(time.monotonic() - self.t, 2)])
            if (st != want) if leave else (st == want):
                return round(time.monotonic() - since, 2)
            time.sleep(self.every / 5)
        return None


def up_said(w: Path, log_at: int) -> list[str]:
    """What `up` said of instance a from byte ``log_at`` of its log on (12 lines at most)."""
    with open(w / "up.log", "rb") as fh:
        fh.seek(log_at)
        return [line for line in fh.read().decode(errors="replace").splitlines()
                if line.startswith("[fleet] a:")][:12]


def sleep_cycle(w: Path, every: float) -> dict[str, Any]:
    """Admin sleep, then wake: seconds to SLEEPING from the ask and to RUNNING from the wake's ask,
    every state on the way, and what `up` said of it."""
    log_at = (w / "up.log").stat().st_size
    out: dict[str, Any] = {}
    states = States(every)
    out["sleep_status"] = admin(w, "sleep")
    out["asleep_after_s"] = states.until("SLEEPING", states.t, 150.0)
    woke = time.monotonic()
    out["wake_status"] = admin(w, "wake")
    out["running_after_s"] = states.until("RUNNING", woke, 300.0)
    out["states"] = states.seen
    out["up_said"] = up_said(w, log_at)
    wait(lambda: fleet_healthy(["a"]), 120, "instance a back in rotation")
    return out
