"""CPUs of their own for the gateway, the load generator and vLLM (serve_pairs.py run --pin).

At 512 concurrent on H200s the gateway's passes ran 0.95× direct's tokens/s with a 1.14× longer
mean gap between tokens (results/serve-pairs-h200-512): vLLM went slower while the gateway
worked. One candidate is the host's CPUs: vLLM's API server and engine core are each one busy
Python thread, and the gateway (a third to half of a core at that load) may share a physical core
with one of them (the machines are VMs with 16 vCPUs; which vCPUs are hyperthread siblings is in
sysfs). Pinned, the gateway gets the last physical core, the client the one before it, vLLM the
rest, so the three cannot meet on a core; unpinned, every process may use every CPU again.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from fleet_supervisor.cpus import physical_cores


def cores() -> list[list[int]]:
    """The machine's CPUs, grouped by physical core (hyperthread siblings together). Not this
    process's affinity: after a pinned pass that is the client's core alone."""
    return physical_cores(frozenset(range(os.cpu_count() or 1)))


def plan(groups: list[list[int]]) -> dict[str, set[int]]:
    """The last core for the gateway, the one before for the client, the rest for vLLM."""
    if len(groups) < 3:
        raise SystemExit(f"--pin needs 3 physical cores, this machine has {len(groups)}")
    return {"gateway": set(groups[-1]), "client": set(groups[-2]),
            "vllm": {c for g in groups[:-2] for c in g}}


def off_host(groups: list[list[int]]) -> tuple[set[int], set[int]]:
    """``start --client-core``: the last physical core for the load generator, the rest for ``up``,
    which places the gateway and vLLM on them by its own default. The client then stands in for
    one on another host: neither path's passes share a CPU with it (results/serve-auto-h200)."""
    if len(groups) < 3:
        raise SystemExit(f"--client-core needs 3 physical cores, this machine has {len(groups)}")
    return set(groups[-1]), {c for g in groups[:-1] for c in g}


def pin(pids: list[int], cpus: set[int]) -> int:
    """Every thread of ``pids`` onto ``cpus``; the threads moved (one that ended meanwhile is skipped)."""
    n = 0
    for pid in pids:
        with contextlib.suppress(FileNotFoundError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(ProcessLookupError):
                    os.sched_setaffinity(int(tid), cpus)
                    n += 1
    return n


def _thread_ticks(pid: int, tid: str) -> int:
    """A thread's CPU time so far in clock ticks (utime + stime), 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of stat(5), counted after the name


def busiest(pids: list[int]) -> tuple[int, int] | None:
    """(PID, TID) of the thread of ``pids`` with the most CPU time so far: an instance's engine core
    loop, which runs each step (launching its kernels one by one under ``--enforce-eager``)."""
    ticks = [(_thread_ticks(pid, tid), pid, int(tid)) for pid in pids
             for tid in (os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else [])]
    return max(ticks)[1:] if ticks else None


def engines_apart(instances: dict[str, list[int]], cpus: list[int]) -> dict[str, Any]:
    """Every thread of every instance's processes (``instances``: name -> its API server's PID, then
    its descendants') onto ``cpus`` less one CPU per instance; then each instance's busiest thread
    below its API server (``busiest``: the engine core's) alone onto one of those, so that no other
    thread of the fleet runs there. What went where, for the pass's row."""
    own = sorted(cpus)[-len(instances):]
    rest = set(cpus) - set(own)
    if not rest:
        raise SystemExit(f"engines apart need more CPUs than instances, not {sorted(cpus)}")
    pin([p for ps in instances.values() for p in ps], rest)
    out: dict[str, Any] = {"rest": sorted(rest)}
    for (name, pids), cpu in zip(sorted(instances.items()), own, strict=True):
        if (thread := busiest(pids[1:])) is not None:
            os.sched_setaffinity(thread[1], {cpu})
            out[name] = {"pid": thread[0], "tid": thread[1], "cpu": cpu}
    return out
