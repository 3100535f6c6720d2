"""The GPUs to plan for: NVML's view of this host, or a spec such as ``--gpus 8x80GB``.

A size in a spec is the marketed one, read as binary (80GB = 80 GiB = 81920 MiB): NVML reports
an A100 80GB as 81920 MiB and an H100 80GB as 81559 MiB, an RTX 4090 24GB as 24564 MiB. Give
``MiB`` for the exact figure (``8x81559MiB``). ``--gpus`` describes one node; ``--nodes`` says how
many such nodes there are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fleetspec.errors import ConfigError
from fleetspec.gpus import Gpu

_SPEC = re.compile(r"^\s*(?:(\d+)\s*[x×*]\s*)?(\d+(?:\.\d+)?)\s*(gb|gib|g|mb|mib|m|tb|tib|t)?\s*$", re.IGNORECASE)
_MIB_PER_UNIT = {"t": 1024 * 1024, "g": 1024, "m": 1}


@dataclass(frozen=True)
class Hardware:
    gpus_per_node: int
    memory_mib: int  # per GPU; the smallest one where they differ, since shards are equal
    nodes: int = 1
    name: str = ""
    indices: tuple[int, ...] = ()  # this node's GPU indices as NVML numbers them
    source: str = "--gpus"

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def local_indices(self) -> tuple[int, ...]:
        return self.indices or tuple(range(self.gpus_per_node))

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 1024 * 1024

    def describe(self) -> str:
        node = f"{self.gpus_per_node} × {self.memory_mib / 1024:.1f} GiB{f' ({self.name})' if self.name else ''}"
        return node + (f" per node × {self.nodes} nodes" if self.nodes > 1 else "") + f" [{self.source}]"


def parse_gpus(spec: str, nodes: int = 1) -> Hardware:
    m = _SPEC.match(spec)
    if m is None:
        raise ConfigError(f"--gpus: cannot read {spec!r}; expected COUNTxSIZE such as 8x80GB, 2x24GB or 4x81559MiB")
    count = int(m.group(1) or 1)
    unit = (m.group(3) or "g")[0].lower()
    mib = int(float(m.group(2)) * _MIB_PER_UNIT[unit])
    if count < 1 or mib < 1:
        raise ConfigError(f"--gpus: {spec!r} must name at least one GPU with some memory")
    if nodes < 1:
        raise ConfigError(f"--nodes: must be at least 1, got {nodes}")
    return Hardware(gpus_per_node=count, memory_mib=mib, nodes=nodes, name=spec.strip(), source="--gpus")


def from_discovered(gpus: list[Gpu], nodes: int = 1) -> Hardware:
    if not gpus:
        raise ConfigError("--gpus: no GPU found by NVML or nvidia-smi on this host; give the GPUs to plan for, "
                          "e.g. --gpus 8x80GB")
    if nodes < 1:
        raise ConfigError(f"--nodes: must be at least 1, got {nodes}")
    names = sorted({g.name for g in gpus})
    return Hardware(gpus_per_node=len(gpus), memory_mib=min(g.memory_total_mib for g in gpus), nodes=nodes,
                    name=", ".join(names), indices=tuple(g.index for g in gpus), source="NVML")
