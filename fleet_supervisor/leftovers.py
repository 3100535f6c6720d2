"""What an earlier run of this fleet left running, and stopping it (the state file: runfile.py).

An ``up`` that was SIGKILLed stops nothing. Its API servers get SIGTERM from the kernel
(process.die_with_parent) and vLLM's then stops its engine, but a child that ignores SIGTERM, and
grandchildren (EngineCore, workers), which never get that signal, stay in their process groups
with their GPU memory and ports. The next ``up`` stops them; ``check`` only names them (exit 2).

Identity before any signal. A recorded process counts as ours only if its pid, start time and
cmdline all still match the record (a pid alone may have been reused). A group is ours if one of
its live members is: Linux does not reuse a number while it is still some group's id, so while a
process of ours is in group G, G is the group our run made and every member of it descends from
our child. A group none of whose members can be verified is named and left alone. (The check
runs again before every signal; between it and killpg the id could only change hands if every
member died and the pid numbers wrapped around in those microseconds.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fleet_supervisor import procfs
from fleet_supervisor.runfile import Child, Proc, RunRecord, read, state_path
from fleetspec.errors import ConfigError
from fleetspec.fleetfile import SupervisorSection

_POLL_S = 0.05
_KILL_WAIT_S = 10.0  # after SIGKILL; only a process stuck in the kernel (D state) takes longer

Say = Callable[[str], None]


def _matches(p: Proc) -> bool:
    st = procfs.stat(p.pid)
    return st is not None and st.live and st.start_time == p.start_time and procfs.cmdline(p.pid) == p.cmdline


@dataclass
class Group:
    """One recorded child's process group that still has live members."""

    child: Child
    members: list[procfs.ProcStat]
    verified: bool
    leader_alive: bool
    # (pid, start time) of members known to be ours: while one of them lives, the group is ours.
    trusted: set[tuple[int, int]] = field(default_factory=set)

    @property
    def pids(self) -> list[int]:
        return sorted(m.pid for m in self.members)

    def line(self) -> str:
        pids = ", ".join(map(str, self.pids))
        port = f", port {self.child.port}" if self.child.port else ""
        return f"{self.child.name}: process group {self.child.pgid} (pids {pids}){port}"

    def still_ours(self) -> list[procfs.ProcStat] | None:
        """The group's live members if it is still provably ours, else None (empty: [])."""
        now = procfs.members({self.child.pgid})[self.child.pgid]
        if not now:
            return []
        if not any((m.pid, m.start_time) in self.trusted for m in now):
            return None
        self.trusted |= {(m.pid, m.start_time) for m in now}
        return now


@dataclass
class Survey:
    path: Path
    record: RunRecord | None = None
    running: bool = False  # the recorded supervisor itself is alive: that fleet is up
    groups: list[Group] = field(default_factory=list)

    @property
    def ours(self) -> list[Group]:
        return [g for g in self.groups if g.verified]

    @property
    def unverified(self) -> list[Group]:
        return [g for g in self.groups if not g.verified]

    def whose(self) -> str:
        assert self.record is not None
        sup = self.record.supervisor
        return f"a previous run of this fleet (`up` pid {sup.pid}, {self.record.fleet_file})"


def survey(path: Path) -> Survey:
    """What of the run recorded at ``path`` is alive now. Signals nothing."""
    found = Survey(path, read(path))
    record = found.record
    if record is None or record.boot_id != procfs.boot_id():
        return found  # no record, or one from before a reboot: none of its processes can exist
    if _matches(record.supervisor):
        found.running = True
        return found
    live = procfs.members({c.pgid for c in record.children})
    for child in record.children:
        leader = procfs.stat(child.pid)
        if leader is not None and leader.start_time != child.start_time:
            continue  # pid G is another process: our group G had emptied before it could be made
        members = [m for m in live[child.pgid] if m.start_time >= child.start_time]
        if not members:
            continue
        mine = {(p.pid, p.start_time) for p in child.members if _matches(p)}
        as_spawned = Proc(pid=child.pid, start_time=child.start_time, cmdline=child.argv)
        leader_alive = _matches(as_spawned) or (child.pid, child.start_time) in mine
        group = Group(child, members, verified=bool(mine), leader_alive=leader_alive)
        if group.verified:
            group.trusted = mine | {(m.pid, m.start_time) for m in members}
        found.groups.append(group)
    return found


def running_message(s: Survey) -> str:
    assert s.record is not None
    pid = s.record.supervisor.pid
    return (f"{s.path}: this fleet is already running (`up` pid {pid}, {s.record.fleet_file}); stop it first "
            f"(kill -TERM {pid}), or give this fleet file another supervisor.state_dir")


def leftovers_message(s: Survey) -> str:
    """For ``check``: what is left, and the two ways to end it."""
    lines = [f"{s.path}: {s.whose()} left processes running:"]
    lines += [f"  {g.line()}" for g in s.ours]
    lines += [f"  {g.line()}  (could not be verified as this fleet's)" for g in s.unverified]
    groups = " ".join(f"-{g.child.pgid}" for g in s.groups)
    lines.append(f"run `vllm-fleet up` to stop them, or kill them: kill -TERM -- {groups} (then -KILL)"
                 if s.ours else f"check them, kill them (kill -TERM -- {groups}), and remove {s.path}")
    return "\n".join(lines)


def unverified_message(s: Survey) -> str:
    lines = [f"{s.path}: processes in process groups of {s.whose()} could not be verified as its own "
             "(pid reused, or renamed since last recorded), so they were left alone:"]
    lines += [f"  {g.line()}" for g in s.unverified]
    groups = " ".join(f"-{g.child.pgid}" for g in s.unverified)
    lines.append(f"if they are this fleet's, stop them (kill -TERM -- {groups}); if not, remove {s.path}")
    return "\n".join(lines)


def _signal(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop(groups: list[Group], stop_grace_s: float, orphan_grace_s: float, say: Say) -> list[Group]:
    """SIGTERM every group, wait its grace, SIGKILL it, wait until it is empty. A group whose API
    server still lives gets ``stop_grace_s`` (it stops its engine); one whose leader is gone gets
    ``orphan_grace_s``, as after a crash. Signals a group only while a process of ours is in it.
    Returns the groups still not empty."""
    t0 = time.monotonic()
    grace = {g.child.pgid: stop_grace_s if g.leader_alive else min(stop_grace_s, orphan_grace_s) for g in groups}
    killed: dict[int, float] = {}
    pending = list(groups)
    for g in pending:
        if g.still_ours():
            _signal(g.child.pgid, signal.SIGTERM)
    while pending:
        now = time.monotonic() - t0
        left: list[Group] = []
        for g in pending:
            members = g.still_ours()
            if not members:  # empty; or (None) no member of ours is left, so nothing we may signal
                continue
            pgid = g.child.pgid
            if pgid not in killed and now >= grace[pgid]:
                _signal(pgid, signal.SIGKILL)
                killed[pgid] = now
                say(f"  {g.child.name}: process group {pgid} still had {len(members)} process(es) after "
                    f"{grace[pgid]:g}s: SIGKILL")
            if pgid in killed and now - killed[pgid] > _KILL_WAIT_S:
                say(f"  {g.child.name}: process group {pgid} survived SIGKILL (stuck in the kernel?)")
                continue
            left.append(g)
        if not left:
            break
        pending = left
        time.sleep(_POLL_S)
    # Anything still in a group now is named, provable or not: ``up`` must not start beside it.
    return [g for g in groups if procfs.members({g.child.pgid})[g.child.pgid]]


def settle(sup: SupervisorSection, *, stop_them: bool, say: Say) -> None:
    """Before ``up`` (``stop_them``) or ``check``: deal with what an earlier run of this fleet left.

    Raises ConfigError (exit 2) when this fleet is running now, when ``check`` finds leftovers,
    and when ``up`` finds some that it may not or could not stop."""
    s = survey(state_path(sup.state_dir))
    if s.running:
        raise ConfigError(running_message(s))
    if not s.groups:
        if s.record is not None and stop_them:
            say(f"{s.path}: {s.whose()} ended without stopping its children; none of them is left")
        return
    if not stop_them:
        raise ConfigError(leftovers_message(s))
    if s.ours:
        say(f"{s.path}: {s.whose()} left processes running; stopping them:")
        for g in s.ours:
            say(f"  {g.line()}")
        t0 = time.monotonic()
        stuck = stop(s.ours, sup.stop_grace_s, sup.orphan_grace_s, say)
        if stuck:
            raise ConfigError(f"{s.path}: could not stop {', '.join(g.line() for g in stuck)}")
        say(f"stopped {len(s.ours)} process group(s) of the previous run in {time.monotonic() - t0:.1f}s")
    if s.unverified:
        raise ConfigError(unverified_message(s))
