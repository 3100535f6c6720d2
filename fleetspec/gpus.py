"""GPU discovery: NVML through nvidia-ml-py, ``nvidia-smi`` when NVML cannot be loaded."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from fleetspec.tiers import VramTier, tier_for_mib


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    memory_total_mib: int
    memory_used_mib: int

    @property
    def tier(self) -> VramTier:
        return tier_for_mib(self.memory_total_mib)


def _from_nvml() -> list[Gpu] | None:
    try:
        import pynvml  # nvidia-ml-py; imported lazily: hosts without a driver never load it
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            name = pynvml.nvmlDeviceGetName(h)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            out.append(Gpu(
                i,
                name.decode() if isinstance(name, bytes) else str(name),
                uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                int(mem.total) // (1024 * 1024),
                int(mem.used) // (1024 * 1024),
            ))
        return out
    finally:
        pynvml.nvmlShutdown()


def _from_nvidia_smi() -> list[Gpu] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        res = subprocess.run(
            [exe, "--query-gpu=index,name,uuid,memory.total,memory.used", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    out = []
    for line in res.stdout.strip().splitlines():
        idx, name, uuid, total, used = (p.strip() for p in line.split(","))
        out.append(Gpu(int(idx), name, uuid, int(float(total)), int(float(used))))
    return out


def discover_gpus() -> list[Gpu]:
    """Every GPU on this host, in NVML index order; empty when there is none or no driver."""
    found = _from_nvml()
    if found is None:
        found = _from_nvidia_smi()
    return found or []
