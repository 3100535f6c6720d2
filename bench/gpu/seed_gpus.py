"""What the GPUs show, for bench/gpu/seed_layout.py: NVML compute processes and memory per GPU, and
which GPUs each instance's process group sits on. In a rehearsal (no GPU) the placement comes from
each process's CUDA_VISIBLE_DEVICES instead, and there is no memory to read."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any


def group(pgid: int) -> list[int]:
    """Live (non-zombie) members of a process group, from /proc."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat[2]) == pgid and stat[0] != "Z":
            found.append(int(d))
    return found


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _visible(pid: int) -> list[int]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []
    for item in raw:
        if item.startswith(b"CUDA_VISIBLE_DEVICES="):
            return [int(x) for x in item.split(b"=", 1)[1].decode().split(",") if x.strip().isdigit()]
    return []


class GpuView:
    def __init__(self, rehearse: bool) -> None:
        self.rehearse = rehearse
        self._nvml: Any = None
        if not rehearse:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml

    def _count(self) -> int:
        return int(self._nvml.nvmlDeviceGetCount()) if self._nvml else 0

    def used_mib(self) -> list[int]:
        nv = self._nvml
        return [int(nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(i)).used) >> 20
                for i in range(self._count())]

    def apps(self, indices: list[int]) -> dict[int, list[tuple[int, int]]]:
        """GPU index -> [(pid, MiB)] of its compute processes."""
        nv = self._nvml
        if nv is None:
            return {i: [] for i in indices}
        out = {}
        for i in indices:
            procs = nv.nvmlDeviceGetComputeRunningProcesses(nv.nvmlDeviceGetHandleByIndex(i))
            out[i] = [(int(p.pid), int(p.usedGpuMemory or 0) >> 20) for p in procs]
        return out

    def group(self, pgid: int) -> list[int]:
        return group(pgid)

    def placement(self, instances: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """Instance -> the GPUs its process group uses (the instance's pid leads its group)."""
        leaders = {n: i["pid"] for n, i in instances.items() if n != "gateway" and i.get("pid")}
        where: dict[str, set[int]] = {n: set() for n in leaders}
        if self.rehearse:
            for n, pg in leaders.items():
                for pid in group(pg):
                    where[n].update(_visible(pid))
            return {"how": "CUDA_VISIBLE_DEVICES of each group's processes (rehearsal: no NVML)",
                    "by_instance": {n: sorted(g) for n, g in where.items()}}
        apps = self.apps(list(range(self._count())))
        for gpu, procs in apps.items():
            for pid, _ in procs:
                for n, pg in leaders.items():
                    if _pgid(pid) == pg:
                        where[n].add(gpu)
        return {"how": "NVML compute processes, by process group", "by_instance": {n: sorted(g) for n, g in
                                                                                   where.items()},
                "compute_apps": apps, "used_mib": self.used_mib()}

    def smi(self) -> str:
        if self.rehearse:
            return "(rehearsal: no nvidia-smi)"
        res = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30)
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv"],
                              capture_output=True, text=True, timeout=30)
        return res.stdout + "\n" + apps.stdout
