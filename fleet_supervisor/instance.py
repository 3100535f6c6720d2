"""The lifecycle loop of one supervised child (a vLLM instance or the gateway).

One loop owns the child's state and is the only code that moves it (state.py has the contract
of every move). "Alive" means the child answers ``GET /health`` with 200: a process that exists
but does not answer is restarted like one that exited, as vLLM's /health turns 503 when its
engine dies while /v1/models keeps answering.

Others *ask* (``request_sleep``, ``request_wake``, ``request_restart``): the request sets a target
and a nudge, and the loop acts on it at the points where it may (never in the middle of a start or
a wake). Instances with a ``sleep:`` block ask the swap policy for budget before they load weights
(``admit``) and drain before they sleep: the gateways stop routing to them and every request in
flight finishes first (sleeping.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

import aiohttp

from fleet_supervisor.command import LaunchSpec
from fleet_supervisor.drain import planned_stop
from fleet_supervisor.healthwatch import HealthWatch
from fleet_supervisor.metrics import FleetMetrics
from fleet_supervisor.process import ManagedProcess
from fleet_supervisor.sleeping import SleepCycle
from fleet_supervisor.state import State, check_transition
from fleet_supervisor.watch import Outcome, Watch, backoff_delay
from fleetspec.fleetfile import SupervisorSection

if TYPE_CHECKING:
    from fleet_supervisor.hub import ControlHub
    from fleet_supervisor.swap import Swapper

__all__ = ["InstanceSupervisor", "backoff_delay"]


class InstanceSupervisor:
    def __init__(self, spec: LaunchSpec, cfg: SupervisorSection, session: aiohttp.ClientSession, *,
                 url: str | None = None, metrics: FleetMetrics | None = None, console: TextIO | None = None) -> None:
        self.spec = spec
        self.name = spec.name
        self.url = url
        self._cfg = cfg
        self._session = session
        self._metrics = metrics
        self._console = console
        self.drain_stalled_s = cfg.drain_stalled_s  # drain.py: busy gauges, counters flat this long: drained
        self.state = State.STOPPED
        self.epoch = 0  # bumped by every move; the gateways acknowledge drains per epoch
        self.since = time.time()
        self._since_mono = time.monotonic()
        self.restarts = 0
        self.rapid_failures = 0
        self.last_exit: str | None = None
        self.proc: ManagedProcess | None = None
        self.urgent = asyncio.Event()  # set by a second Ctrl-C: skip the rest of the grace period
        # Called after every move with (old, new), inside the loop: observers must not block.
        self.on_transition: Callable[[State, State], None] | None = None
        self.woke_at = 0.0
        self.target = "awake"
        self.restart_wanted = False
        self.retire_wanted = False  # a reload removed it: drain, stop, and end the loop
        self.nudge = asyncio.Event()
        self.swapper: Swapper | None = None
        self.hub: ControlHub | None = None
        self.reconfigure(spec, url)

    def reconfigure(self, spec: LaunchSpec, url: str | None) -> None:
        """Take a new launch spec (a reload); it is used from the next start on."""
        self.spec, self.url = spec, url
        # Sleep and wake (swap.py reads these; sleeping.py acts on them).
        self.models = list(spec.models)
        self.sleep_cfg = spec.sleep.cfg if spec.sleep else None
        self.devices = list(spec.sleep.devices) if spec.sleep else []
        self.share = spec.sleep.share if spec.sleep else 0.0
        self.cycle = SleepCycle(self, self._session, self._metrics) if spec.sleep else None
        self._health = HealthWatch(spec.health_url, self._cfg, self._session)

    # -- observation ------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def elapsed(self) -> float:
        return time.monotonic() - self._since_mono

    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name, "state": self.state.value, "pid": self.pid, "restarts": self.restarts,
            "url": self.url, "since": self.since, "elapsed_s": round(self.elapsed(), 1),
            "last_exit": self.last_exit, "epoch": self.epoch, "models": self.models,
            # The GPU group as launched (the console's per-instance GPUs); [] on CPU.
            "gpus": [int(g) for g in self.spec.env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip().isdigit()]}
        if self.spec.sleep is not None:
            s = self.spec.sleep
            out["sleep"] = {"mode": s.mode, "level": s.level, "share": s.share, "devices": list(s.devices),
                            "target": self.target}
        return out

    def say(self, message: str) -> None:
        if self._console is not None:
            self._console.write(f"[fleet] {self.name}: {message}\n")
            self._console.flush()

    def set(self, new: State) -> None:
        old = self.state
        check_transition(old, new)
        took = self.elapsed()
        self.state, self.since, self._since_mono = new, time.time(), time.monotonic()
        self.epoch += 1
        if new is State.RUNNING:
            self.woke_at = self.since
        if self._metrics is not None:
            self._metrics.set_state(self.name, new)
        detail = f" after {took:.1f}s" if old in (State.STARTING, State.RUNNING, State.BACKOFF, State.DRAINING,
                                                   State.WAKING) else ""
        self.say(f"{old.value} -> {new.value}{detail}")
        if self.on_transition is not None:
            self.on_transition(old, new)

    # -- requests from others ---------------------------------------------------------------------

    def request_sleep(self, reason: str) -> None:
        if self.cycle is None:
            raise ValueError(f"instance '{self.name}' has no sleep: block, so it cannot sleep")
        self.target = "asleep"
        self.say(f"asked to sleep ({reason})")
        self.nudge.set()

    def request_wake(self, reason: str) -> None:
        if self.cycle is None:
            raise ValueError(f"instance '{self.name}' has no sleep: block; it is always awake")
        if self.target != "awake":
            self.say(f"asked to wake ({reason})")
            if self.cycle is not None:
                self.cycle.wake_asked_at = time.monotonic()
        self.target = "awake"
        self.nudge.set()

    def request_restart(self) -> None:
        self.restart_wanted = True
        self.nudge.set()

    def request_retire(self) -> None:
        """Drain (when running), stop, and end the loop: the instance leaves the fleet."""
        self.retire_wanted = True
        self.nudge.set()

    # -- the loop ---------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set (then the group is stopped) or the child turns FATAL."""
        try:
            await self._loop(stop)
        finally:
            # Also on cancellation or a bug: never leave a process group behind.
            await self._stop_proc()
            if self.state not in (State.STOPPED, State.FATAL):
                if self.state is not State.STOPPING:
                    self.set(State.STOPPING)
                self.set(State.STOPPED)

    async def _loop(self, stop: asyncio.Event) -> None:
        waking = False
        if self.retire_wanted:
            return
        if self.cycle is not None and self.cycle.starts_asleep():
            self.target = "asleep"
            self.set(State.SLEEPING)
            if not await self.cycle.await_wake(stop):
                return
            waking = True
        while not stop.is_set() and not self.retire_wanted:
            if self.swapper is not None and not await self._admitted(stop):
                return
            self.set(State.WAKING if waking else State.STARTING)
            outcome, ran_s = await self._one_run(stop, waking)
            waking = False
            if outcome is Outcome.STOP:
                if self.state is not State.STOPPED:  # STOPPED: retired, its group already stopped
                    self.set(State.STOPPING)
                return
            if outcome is Outcome.RESTART:
                continue  # STOPPED, group empty: start again at once
            if outcome is Outcome.SLEPT:
                assert self.cycle is not None
                if not await self.cycle.await_wake(stop):
                    return
                waking = True
                continue
            self.set(State.EXITED)
            self.say(self.last_exit or "failed")
            await self._stop_proc()
            if stop.is_set():
                self.set(State.STOPPING)
                return
            if ran_s >= self._cfg.start_secs:
                self.rapid_failures = 0  # it ran long enough: this failure is not part of a crash loop
                attempt = 1
            else:
                self.rapid_failures += 1
                attempt = self.rapid_failures
            if self.rapid_failures > self._cfg.start_retries:
                self.set(State.FATAL)
                self.say(f"gave up after {self.rapid_failures} rapid failures in a row (start_retries="
                         f"{self._cfg.start_retries}); it stays down until the fleet is restarted")
                return
            delay = backoff_delay(self._cfg, attempt)
            self.set(State.BACKOFF)
            self.say(f"restarting in {delay:.1f}s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            if stop.is_set():
                self.set(State.STOPPING)
                return
            self.restarts += 1
            if self._metrics is not None:
                self._metrics.count_restart(self.name)

    async def _admitted(self, stop: asyncio.Event) -> bool:
        """Wait for the swap policy's budget before loading weights; False when a stop came first."""
        assert self.swapper is not None
        admit = asyncio.create_task(self.swapper.admit(self))
        halt = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({admit, halt}, return_when=asyncio.FIRST_COMPLETED)
            return admit.done() and not halt.done()
        finally:
            admit.cancel()
            halt.cancel()

    async def _one_run(self, stop: asyncio.Event, waking: bool) -> tuple[Outcome, float]:
        """Start once; return why the run ended and how long it was RUNNING."""
        proc = ManagedProcess(self.spec, self._console)
        watch: Watch | None = None
        try:
            async with self.memory():  # a start profiles the device's free memory: nobody else moves it
                try:
                    await proc.start()
                except OSError as e:
                    self.last_exit = f"cannot start {self.spec.argv[0]!r}: {e.strerror or e}"
                    return Outcome.EXITED, 0.0
                self.proc = proc
                watch = Watch(proc, stop, self.nudge)
                outcome = await self._await_healthy(watch)
            if outcome is not Outcome.HEALTHY:
                return self.ended(outcome, "while waking" if waking else "while starting"), 0.0
            if waking and self.cycle is not None:
                self.cycle.woke()
            self.set(State.RUNNING)
            started = time.monotonic()
            while True:
                outcome = await self.monitor(watch, self._takes_command)
                if outcome is not Outcome.COMMAND:
                    return self.ended(outcome, "while running"), time.monotonic() - started
                if self.retire_wanted or self.restart_wanted:
                    return await self._planned(watch), time.monotonic() - started
                assert self.cycle is not None
                outcome = await self.cycle.sleep_and_wake(watch)
                if outcome is not Outcome.HEALTHY:  # slept cold, exited, stopped or failed
                    return self.ended(outcome, "while sleeping or waking"), time.monotonic() - started
        finally:
            if watch is not None:
                watch.close()

    def memory(self) -> contextlib.AbstractAsyncContextManager[None]:
        """The swap policy's lock on this instance's devices, around a start, a sleep or a wake."""
        return self.swapper.memory(self) if self.swapper is not None else contextlib.nullcontext()

    def _takes_command(self) -> bool:
        return self.restart_wanted or self.retire_wanted or (self.cycle is not None and self.target == "asleep")

    async def _planned(self, watch: Watch) -> Outcome:
        """A restart or a retirement asked for while RUNNING: drain first, then stop the group."""
        retire = self.retire_wanted
        self.restart_wanted = False
        outcome = await planned_stop(self, watch, self._session,
                                     "removed from the fleet" if retire else "restarting as asked")
        if outcome is not Outcome.HEALTHY:
            return outcome
        return Outcome.STOP if retire else Outcome.RESTART

    def ended(self, outcome: Outcome, when: str) -> Outcome:
        if outcome is Outcome.EXITED:
            self.last_exit = f"exited with code {self.proc.returncode if self.proc else '?'} {when}"
        return outcome

    async def _await_healthy(self, watch: Watch) -> Outcome:
        # Polling a port that refuses connections is nearly free, and every poll interval is added
        # to every restart and cold wake: poll fast while starting, faster for sleepers.
        outcome, why = await self._health.until_healthy(watch, 0.25 if self.cycle is None else 0.05)
        self.last_exit = why or self.last_exit
        return outcome

    async def monitor(self, watch: Watch, takes: Callable[[], bool]) -> Outcome:
        outcome, why = await self._health.monitor(watch, takes)
        self.last_exit = why or self.last_exit
        return outcome

    async def stop_proc(self) -> None:
        await self._stop_proc()

    async def _stop_proc(self) -> None:
        proc = self.proc
        if proc is None:
            return
        try:
            if not await proc.stop(self._cfg.stop_grace_s, self.urgent, self._cfg.orphan_grace_s):
                self.say(f"process group {proc.pid} survived SIGKILL (stuck in the kernel?)")
        finally:
            self.proc = None  # pid stays visible in /instances until the group is gone
