"""The state file of a running fleet: which processes this ``up`` started, so that the next ``up``
(or ``check``) can find them if this one dies without stopping them (SIGKILL, the OOM killer).

``STATE_DIR/processes.json``, rewritten atomically whenever it changes::

    {"version": 1, "fleet_file": "/etc/vllm-fleet/fleet.yaml", "boot_id": "…",
     "supervisor": {"pid": 812, "start_time": 91234, "cmdline": ["…/python", "…", "up", …]},
     "children": [{"name": "qwen", "pid": 901, "pgid": 901, "start_time": 91301, "port": 8001,
                   "argv": ["…"], "members": [{"pid": 901, "start_time": 91301, "cmdline": ["…"]},
                                              {"pid": 950, "start_time": 93310, "cmdline": ["VLLM::EngineCore"]}]}]}

A process is named by (boot id, pid, start time) and its cmdline as last seen (procfs.py); the next
``up`` signals nothing that does not match. ``members`` are the live processes of each child's
group: vLLM starts EngineCore and workers long after the API server, and some rename themselves
(setproctitle), so the groups are scanned again every few seconds (~2 ms for 100 processes).
The file is removed once ``up`` has stopped everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, ValidationError

from fleet_supervisor import procfs
from fleetspec.errors import ConfigError

STATE_FILE = "processes.json"
_TICK_S = 0.25  # how often the set of children is compared: a new API server is recorded at once
_SCAN_S = 2.0  # how often the groups' members are scanned in /proc


class Proc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pid: int
    start_time: int
    cmdline: list[str]


class Child(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    pid: int
    pgid: int
    start_time: int
    port: int | None
    argv: list[str]
    members: list[Proc]


class RunRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: Literal[1] = 1
    fleet_file: str
    boot_id: str
    supervisor: Proc
    children: list[Child]


class Launched(NamedTuple):
    """What the fleet knows of one child it spawned: its group leader and where it listens."""

    name: str
    pid: int
    port: int | None
    argv: list[str]


def state_path(state_dir: str | Path) -> Path:
    return Path(state_dir) / STATE_FILE


def read(path: Path) -> RunRecord | None:
    """The record at ``path``; None when there is none. A file that cannot be read is a ConfigError
    (exit 2): guessing what it meant could mean signalling the wrong processes."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the state of the previous run: {e.strerror or e}") from e
    try:
        return RunRecord.model_validate_json(text)
    except ValidationError as e:
        raise ConfigError(f"{path}: not a vllm-fleet state file ({e.error_count()} problems); remove it once "
                          "you are sure no process of an earlier run of this fleet is left") from e


def write(path: Path, record: RunRecord) -> None:
    """Atomically, so a reader never sees half a file, even when we are killed mid-write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(record.model_dump_json(indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)


def this_process() -> Proc:
    pid = os.getpid()
    st = procfs.stat(pid)
    return Proc(pid=pid, start_time=st.start_time if st else 0, cmdline=procfs.cmdline(pid) or [])


def proc_now(pid: int, st: procfs.ProcStat) -> Proc | None:
    cmd = procfs.cmdline(pid)
    return None if cmd is None else Proc(pid=pid, start_time=st.start_time, cmdline=cmd)


class Recorder:
    """Keeps ``path`` up to date with the children that ``children()`` lists and their groups."""

    def __init__(self, path: Path, fleet_file: str, children: Callable[[], list[Launched]]) -> None:
        self.path = path
        self._fleet_file = str(Path(fleet_file).resolve())
        self._children = children
        self._supervisor = this_process()
        self._boot_id = procfs.boot_id()
        self._last: RunRecord | None = None

    def _child(self, c: Launched, members: list[procfs.ProcStat]) -> Child | None:
        leader = procfs.stat(c.pid)
        previous = next((p for p in self._last.children if p.pid == c.pid), None) if self._last else None
        # A dead leader's start time is that of its last record: its workers may still be there.
        start = leader.start_time if leader is not None else previous.start_time if previous else None
        if start is None:
            return None
        procs = [p for p in (proc_now(m.pid, m) for m in sorted(members, key=lambda m: m.pid)) if p is not None]
        return Child(name=c.name, pid=c.pid, pgid=c.pid, start_time=start, port=c.port, argv=c.argv, members=procs)

    def record(self) -> None:
        """Scan the groups and rewrite the file if anything changed."""
        launched = self._children()
        groups = procfs.members({c.pid for c in launched})
        children = [ch for ch in (self._child(c, groups[c.pid]) for c in launched) if ch is not None]
        record = RunRecord(fleet_file=self._fleet_file, boot_id=self._boot_id, supervisor=self._supervisor,
                           children=children)
        if record != self._last:
            write(self.path, record)
            self._last = record

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        seen: set[int] = set()
        scanned = loop.time()
        while True:
            await asyncio.sleep(_TICK_S)
            leaders = {c.pid for c in self._children()}
            if leaders != seen or loop.time() - scanned >= _SCAN_S:
                self.record()
                seen, scanned = leaders, loop.time()

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
