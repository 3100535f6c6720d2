"""What Linux's /proc says about a process: its group, session, state and start time.

A pid alone does not name a process: once it exits, the kernel may hand the number to another one.
``(boot id, pid, start time)`` does, since the start time (clock ticks since boot) of the process
now holding a pid differs from that of the one that held it before. Everything here reads /proc
afresh and answers None for a process that is gone, so callers never hold stale facts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
_START_TIME_FIELD = 19  # starttime is field 22 of /proc/PID/stat; the list below starts at field 3


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str  # "R", "S", "D", "Z" (zombie: exited, not reaped yet), ...
    ppid: int
    pgid: int
    sid: int
    start_time: int  # clock ticks after boot

    @property
    def live(self) -> bool:
        """A zombie has released its memory, GPU and ports: it only waits for its parent."""
        return self.state != "Z"


def stat(pid: int) -> ProcStat | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # comm may hold spaces and parentheses: split on the last ')'.
    fields = raw.rsplit(b")", 1)[1].split()
    return ProcStat(pid=pid, state=fields[0].decode(), ppid=int(fields[1]), pgid=int(fields[2]),
                    sid=int(fields[3]), start_time=int(fields[_START_TIME_FIELD]))


def cmdline(pid: int) -> list[str] | None:
    """argv as the process shows it now (setproctitle rewrites it: vLLM's EngineCore does)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return [part.decode("utf-8", "surrogateescape") for part in raw.rstrip(b"\0").split(b"\0")] if raw else []


def live(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    st = stat(pid)
    return st is not None and st.live


def boot_id() -> str:
    try:
        with open(BOOT_ID_PATH, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def members(pgids: set[int]) -> dict[int, list[ProcStat]]:
    """Live (non-zombie) processes of each group in ``pgids``, one pass over /proc."""
    found: dict[int, list[ProcStat]] = {g: [] for g in pgids}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        st = stat(int(entry))
        if st is not None and st.live and st.pgid in found:
            found[st.pgid].append(st)
    return found
