"""One child process group: spawn it, copy its output, and stop the whole group.

vLLM's API server forks EngineCore and tensor-parallel workers that survive a killed parent and
keep holding GPU memory (DESIGN §3). So each child starts a new session (its pid is the group
id), every signal goes to the group, and the child counts as stopped only when
``killpg(pgid, 0)`` finds nobody — which also needs every member reaped, the leader included,
because a zombie still belongs to its group.

Each child also gets SIGTERM when the supervisor dies (PR_SET_PDEATHSIG), so a SIGKILLed ``up``
does not leave API servers holding GPUs and ports; vLLM's API server stops its EngineCore and
workers on SIGTERM. What still outlives it (a child that ignores SIGTERM, or grandchildren, which
never get that signal) is found and stopped by the next ``up`` (leftovers.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import BinaryIO, TextIO

from fleet_supervisor import procfs
from fleet_supervisor.command import LaunchSpec

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_POLL_S = 0.05
_KILL_WAIT_S = 10.0  # after SIGKILL; only a process stuck in the kernel (D state) takes longer


def become_subreaper(on: bool = True) -> bool:
    """Adopt orphaned descendants (Linux). Workers of a dead API server then become our children
    and we reap them at once, instead of depending on whatever runs as PID 1 in a container."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGTERM when we die (Linux), else None.

    SIGTERM rather than SIGKILL: vLLM's API server then shuts its engine down, which a SIGKILLed
    one never does (DESIGN §3). The kernel sends it when the *thread* that forked the child ends;
    asyncio forks from the event loop's thread, and the loop outlives every child it spawned
    (Fleet.run stops every group before it returns), so that thread's end is our end.
    Only the child gets it: the death signal is cleared on fork, so EngineCore and workers rely
    on vLLM's shutdown, and the next ``up`` stops whatever is left (leftovers.py)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork, not in the child
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # we died between fork and prctl: no signal would ever come
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def child_setup(cpus: frozenset[int] | None) -> Callable[[], None] | None:
    """The ``preexec_fn`` of a child: ``die_with_parent``, and the CPUs it may run on (cpus.py). Set
    before exec, so every process and thread it starts inherits them."""
    death = die_with_parent()
    if cpus is None:
        return death

    def preexec() -> None:
        if death is not None:
            death()
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as e:  # a CPU went offline since the plan: run where it may, and say so in its log
            os.write(2, f"[fleet] cannot place on CPUs {sorted(cpus)}: {e}; running on every CPU\n".encode())

    return preexec


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member changed uid: it exists all the same
        return True
    return True


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class ManagedProcess:
    """One run of a child. Not restartable: the lifecycle loop makes a new one per start."""

    def __init__(self, spec: LaunchSpec, console: TextIO | None) -> None:
        self.spec = spec
        self._console = console
        self._proc: asyncio.subprocess.Process | None = None
        self._pump: asyncio.Task[None] | None = None
        self._log: BinaryIO | None = None
        self.started_at = 0.0

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode if self._proc else None

    def _open_log(self) -> BinaryIO:
        # Appends: the log of a crashed run is what explains the restart that follows it.
        self.spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.spec.log_path, "ab")  # noqa: SIM115 - the output pump closes it
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        log.write(f"=== {stamp} start: {' '.join(self.spec.argv)}\n".encode())
        log.flush()
        return log

    async def start(self) -> None:
        """Spawn; raises OSError when the command cannot be executed at all."""
        self._log = self._open_log()
        # Our own pipe rather than stdout=PIPE: forked workers inherit the write end, and an
        # asyncio-owned pipe would tie Process.wait() to them as well as to the leader.
        read_fd, write_fd = os.pipe()
        # A process group of its own (stopped as one), in the supervisor's session, not one of its
        # own: with the kernel's autogroup (on by default in most distributions) every session is a
        # scheduling group, and a group that sleeps most of the time (the gateway, the supervisor)
        # waited seconds for a CPU while a CPU vLLM's engine and worker, in their own session, kept
        # both cores of a 2-core host busy: the gateway's main thread was off a CPU 69-79 % of a
        # streaming run, and under short probe settings its probes timed out (503s). In one session
        # the threads share the CPUs fairly: 1-2 % (bench/autogroup.py).
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self.spec.argv, env=self.spec.env, stdin=asyncio.subprocess.DEVNULL,
                stdout=write_fd, stderr=write_fd, process_group=0, preexec_fn=child_setup(self.spec.cpus),
            )
        except BaseException:
            os.close(read_fd)
            self._log.close()
            raise
        finally:
            os.close(write_fd)
        self.started_at = time.monotonic()
        self._log.write(f"=== pid {self._proc.pid}\n".encode())
        self._pump = asyncio.create_task(self._copy_output(read_fd), name=f"pump-{self.spec.name}")

    async def wait(self) -> int:
        assert self._proc is not None
        return await self._proc.wait()

    async def _copy_output(self, read_fd: int) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 20, loop=loop)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader, loop=loop), os.fdopen(read_fd, "rb", buffering=0))
        log = self._log
        assert log is not None
        try:
            while True:
                try:
                    line = await reader.readline()
                except ValueError:  # a line over the limit: pass it on in pieces
                    line = await reader.read(1 << 16)
                if not line:
                    break
                log.write(line)
                log.flush()
                if self._console is not None:
                    text = line.decode("utf-8", "replace").rstrip("\r\n")
                    self._console.write(f"[{self.spec.name}] {text}\n")
                    self._console.flush()
        finally:
            transport.close()
            log.close()

    def _reap_orphans(self, pgid: int) -> None:
        """Reap members of the group that were re-parented to us (see become_subreaper). Only
        after the leader is reaped: waitpid(-pgid) could otherwise steal the leader's status
        from asyncio's child watcher."""
        if self.returncode is None:
            return
        while True:
            try:
                pid, _ = os.waitpid(-pgid, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    async def _wait_group_empty(self, pgid: int, limit_s: float) -> bool:
        deadline = time.monotonic() + limit_s
        while True:
            self._reap_orphans(pgid)
            if not group_alive(pgid):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(_POLL_S)

    async def stop(self, grace_s: float, urgent: asyncio.Event | None = None,
                   orphan_grace_s: float | None = None) -> bool:
        """SIGTERM the group, wait up to ``grace_s`` (less once ``urgent`` is set), SIGKILL the
        group, and return once it is empty. False if members survived SIGKILL (D state).

        When the leader is already dead (a crash, not a stop), the group gets ``orphan_grace_s``
        instead, if that is shorter: what is left are workers of an API server that will never
        shut them down, and until they are gone the restart waits and their GPU memory stays
        taken. The choice is made before signalling: a leader that exits on our SIGTERM while
        its workers shut down is a requested stop and keeps the whole grace."""
        if self._proc is None:
            return True
        pgid = self._proc.pid
        emptied = not group_alive(pgid) and self.returncode is not None
        if not emptied:
            leader_dead = self.returncode is not None or not procfs.live(pgid)
            if leader_dead and orphan_grace_s is not None:
                grace_s = min(grace_s, orphan_grace_s)
            _signal_group(pgid, signal.SIGTERM)
            emptied = await self._wait_grace(pgid, grace_s, urgent)
        if not emptied:
            _signal_group(pgid, signal.SIGKILL)
            emptied = await self._wait_group_empty(pgid, _KILL_WAIT_S)
        if emptied:
            # The watcher thread has reaped the leader; let its callback record the status.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._proc.wait(), 5.0)
        if self._pump is not None:
            # Every writer is gone once the group is empty, so the pipe is at EOF.
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._pump, 5.0)
        return emptied

    async def _wait_grace(self, pgid: int, grace_s: float, urgent: asyncio.Event | None) -> bool:
        if urgent is None:
            return await self._wait_group_empty(pgid, grace_s)
        waiter = asyncio.create_task(self._wait_group_empty(pgid, grace_s))
        hurry = asyncio.create_task(urgent.wait())
        try:
            await asyncio.wait({waiter, hurry}, return_when=asyncio.FIRST_COMPLETED)
            return waiter.done() and waiter.result()
        finally:
            waiter.cancel()
            hurry.cancel()
