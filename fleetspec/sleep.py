"""More models than memory: the fleet file's ``sleep:`` block per instance, the ``swap:`` section, and
the memory-budget rules that ``check`` enforces (docs/sleep.md).

Every instance with a ``sleep:`` block takes a *share* of each device it runs on (its GPUs, or the
host for ``device: cpu``): by default its ``gpu_memory_utilization``. On each device the shares of
the instances awake at once never exceed ``swap.budget``; the supervisor puts the least recently
used idle instance to sleep to make room for one that requests wait for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

CPU_DEVICE = "cpu"  # the budget key of device: cpu instances: the host's memory


class SleepSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["auto", "vllm", "cold"] = Field(
        "auto", description="vllm: vLLM's sleep mode (the process stays, GPU memory is released); cold: the "
        "process group is stopped and started again; auto: vllm for device: cuda with vLLM as the command, "
        "else cold (the CPU build has no sleep mode)")
    level: Literal["auto", 1, 2] = Field(
        "auto", description="vLLM sleep level. 1 keeps the weights in host RAM (fastest wake); 2 discards them and "
        "reloads from disk on wake. auto: 1 when the host can hold every level-1 sleeper's weights, else 2 "
        "(check says which)")
    idle_s: float | None = Field(
        None, gt=0, description="put to sleep after this many seconds without a request (counted from the last "
        "request); null: only when another model needs the memory")
    preload: bool = Field(False, description="awake after start-up; otherwise it is put to sleep once ready")
    share: float | None = Field(
        None, gt=0, le=1, description="its share of each of its devices' budget; default its gpu_memory_utilization")
    wake_timeout_s: float = Field(
        120.0, gt=0, description="a vLLM wake (wake_up, reload) longer than this is given up: cold restart")


class SwapSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    budget: float = Field(
        1.0, gt=0, le=1, description="per device (GPU, or the host for CPU instances): the largest sum of the "
        "shares of sleep-capable instances awake at once")
    hold_s: float = Field(
        10.0, ge=0, description="once requests wait for another model, an instance that still has requests in flight "
        "keeps its memory at most this long before it is drained (no model starves, none thrashes)")


class Sleeper(Protocol):
    """What the budget rules read of an instance (fleetfile.Instance)."""

    name: str
    gpus: list[int]
    device: Literal["cuda", "cpu"]
    gpu_memory_utilization: float
    sleep: SleepSection | None


def devices(inst: Sleeper) -> list[str]:
    """The budget keys an instance occupies: its GPUs, or the host."""
    return [str(g) for g in inst.gpus] if inst.device == "cuda" else [CPU_DEVICE]


def share(inst: Sleeper) -> float:
    if inst.sleep is not None and inst.sleep.share is not None:
        return inst.sleep.share
    return inst.gpu_memory_utilization


def _device_name(d: str) -> str:
    return "the host (device: cpu)" if d == CPU_DEVICE else f"GPU {d}"


def budget_problems(instances: Sequence[Sleeper], swap: SwapSection) -> list[str]:
    """One message per rule broken, naming the device, the instances and the key to change."""
    problems: list[str] = []
    by_device: dict[str, list[tuple[int, Sleeper]]] = {}
    for i, inst in enumerate(instances):
        if inst.sleep is None:
            continue
        if share(inst) > swap.budget:
            problems.append(f"instances[{i}] ({inst.name}).sleep.share: its share {share(inst):g} is more than "
                            f"swap.budget ({swap.budget:g}), so it could never be woken; lower the share or "
                            "gpu_memory_utilization, or raise swap.budget")
        for d in devices(inst):
            by_device.setdefault(d, []).append((i, inst))
    for d, members in sorted(by_device.items()):
        preloaded = [(i, inst) for i, inst in members if inst.sleep is not None and inst.sleep.preload]
        total = sum(share(inst) for _, inst in preloaded)
        if total > swap.budget + 1e-9:
            names = ", ".join(f"{inst.name} ({share(inst):g})" for _, inst in preloaded)
            problems.append(f"instances[{preloaded[-1][0]}] ({preloaded[-1][1].name}).sleep.preload: "
                            f"{_device_name(d)} cannot hold the preloaded instances {names} = {total:g} within "
                            f"swap.budget ({swap.budget:g}); preload fewer of them")
    return problems
