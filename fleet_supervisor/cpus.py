"""Where the gateway and the instances run: CPUs of their own for the gateway (gateway.cpus).

vLLM's API server and its engine core are each one busy Python thread. On two H200s at 512 streams,
the gateway sharing their CPUs cost 8 % of vLLM's tokens/s; with the gateway, the load generator and
vLLM each on CPUs of their own, the gateway's passes were 1.04× direct's
(bench/gpu/results/serve-pin-h200-512). Under this default with the load generator on the same
host and not placed, the gateway met tokens/s at 256 and missed at 1,024 (serve-auto-h200); with
that client on a core of its own, 1,024 read tokens/s 0.98× and TTFT p50 0.97× (serve-cc-h200),
inside the benchmark's pass-to-pass spread. Nothing measured is a case for changing the default.
A one-worker gateway is one event loop, so one core is all it can use; ``workers`` N get N cores.

The placement is set in the child between fork and exec (process.py), so every process and thread a
child starts later (EngineCore, tensor-parallel workers, uvicorn's workers) inherits it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from fleetspec.fleetfile import FleetFile

_SYSFS = Path("/sys/devices/system/cpu")
_AUTO_SHARE = 4  # auto: the gateway takes at most 1/4 of the cores, so it cannot starve vLLM


@dataclass(frozen=True)
class Placement:
    gateway: frozenset[int] | None  # None: no placement, every CPU this process may use
    instances: frozenset[int] | None
    why: str  # for `check` and `up`: what was decided and from what

    def describe(self) -> str:
        if self.gateway is None or self.instances is None:
            return f"not placed ({self.why})"
        return f"gateway on {span(self.gateway)}, instances on {span(self.instances)} ({self.why})"


def allowed_cpus() -> frozenset[int]:
    """The CPUs this process may run on (a container's cpuset, taskset), which children inherit."""
    return frozenset(os.sched_getaffinity(0))


def physical_cores(allowed: frozenset[int], sysfs: Path = _SYSFS) -> list[list[int]]:
    """``allowed`` grouped by physical core (hyperthread siblings together), in CPU order. Without
    sysfs each CPU counts as a core of its own."""
    groups: dict[str, list[int]] = {}
    for cpu in sorted(allowed):
        path = sysfs / f"cpu{cpu}" / "topology" / "thread_siblings_list"
        try:
            key = path.read_text().strip()
        except OSError:
            key = f"cpu{cpu}"
        groups.setdefault(key, []).append(cpu)
    return sorted(groups.values())


def span(cpus: frozenset[int]) -> str:
    """{0, 1, 2, 5} -> '0-2,5' (the notation of taskset and /proc/*/status)."""
    out: list[str] = []
    for cpu in sorted(cpus):
        if out and out[-1].split("-")[-1] == str(cpu - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{cpu}"
        else:
            out.append(str(cpu))
    return ",".join(out)


def problems(fleet: FleetFile, allowed: frozenset[int]) -> list[str]:
    """What is wrong with a list of CPU ids in gateway.cpus on this host; one message each."""
    chosen = fleet.gateway.cpus
    if not isinstance(chosen, list):
        return []
    have = f"CPUs this process may use: {span(allowed)}"
    if not chosen:
        return ["gateway.cpus: the list is empty; list CPU ids, or use auto or all"]
    out = []
    if len(set(chosen)) != len(chosen):
        out.append(f"gateway.cpus: lists a CPU twice: {chosen}; list each CPU once")
    missing = sorted(set(chosen) - allowed)
    if missing:
        out.append(f"gateway.cpus: CPU {', '.join(map(str, missing))} is not one this process may use ({have}); "
                   "use those ids, or auto")
    elif set(chosen) >= allowed:
        out.append(f"gateway.cpus: takes every CPU ({have}) and leaves none for the instances; list fewer, "
                   "or use all")
    return out


def place(fleet: FleetFile, allowed: frozenset[int], cores: list[list[int]]) -> Placement:
    """gateway.cpus on this host (``cores``: ``allowed`` by physical core). A list that does not fit
    is for ``problems`` to report; here it is not placed."""
    chosen = fleet.gateway.cpus
    if chosen == "all":
        return Placement(None, None, "gateway.cpus: all")
    if isinstance(chosen, list):
        if problems(fleet, allowed):
            return Placement(None, None, "gateway.cpus does not fit this host")
        return Placement(frozenset(chosen), allowed - frozenset(chosen), "gateway.cpus")
    if any(inst.device == "cpu" for inst in fleet.instances):
        # The CPU build binds its OpenMP threads to the CPUs it finds: those are vLLM's to spread.
        return Placement(None, None, "auto: a device: cpu instance places its own threads")
    want = fleet.gateway.workers
    if want * _AUTO_SHARE > len(cores):
        return Placement(None, None, f"auto: {want} gateway worker(s) would take more than 1/{_AUTO_SHARE} of "
                         f"the {len(cores)} physical cores")
    gateway = frozenset(c for group in cores[-want:] for c in group)
    return Placement(gateway, allowed - gateway,
                     f"auto: {want} of {len(cores)} physical cores for {want} gateway worker(s)")
