"""The lifecycle loop of one supervised child (a vLLM instance or the gateway).

One loop owns the child's state and is the only code that moves it (state.py has the contract
of every move). "Alive" means the child answers ``GET /health`` with 200: a process that exists
but does not answer is restarted like one that exited, as vLLM's /health turns 503 when its
engine dies while /v1/models keeps answering.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from enum import Enum
from typing import Any, TextIO

import aiohttp
from tenacity import RetryCallState, Retrying, wait_exponential

from fleet_supervisor.command import LaunchSpec
from fleet_supervisor.metrics import FleetMetrics
from fleet_supervisor.process import ManagedProcess
from fleet_supervisor.state import State, check_transition
from fleetspec.fleetfile import SupervisorSection


class Outcome(Enum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"  # a probe failed (one probe while running; the deadline while starting)
    EXITED = "exited"
    STOP = "stop"


def backoff_delay(cfg: SupervisorSection, attempt: int) -> float:
    """Delay before restart number ``attempt`` (1-based) of a run of failures: initial * 2**(n-1),
    capped at backoff_max_s — tenacity's wait_exponential, so the curve is the usual one."""
    wait = wait_exponential(multiplier=cfg.backoff_initial_s, min=cfg.backoff_initial_s, max=cfg.backoff_max_s)
    retry_state = RetryCallState(Retrying(), None, (), {})
    retry_state.attempt_number = max(1, attempt)
    return float(wait(retry_state))


class _Watch:
    """Races every wait of one run against the process exiting and a stop being requested, so
    neither waits for the end of a sleep or a probe."""

    def __init__(self, proc: ManagedProcess, stop: asyncio.Event) -> None:
        self.exit = asyncio.create_task(proc.wait())
        self.stop = asyncio.create_task(stop.wait())

    def _event(self) -> Outcome | None:
        if self.stop.done():
            return Outcome.STOP
        if self.exit.done():
            return Outcome.EXITED
        return None

    async def pause(self, seconds: float) -> Outcome | None:
        await asyncio.wait({self.exit, self.stop}, timeout=max(0.0, seconds), return_when=asyncio.FIRST_COMPLETED)
        return self._event()

    async def probe(self, check: Coroutine[Any, Any, bool]) -> Outcome:
        task = asyncio.create_task(check)
        try:
            await asyncio.wait({task, self.exit, self.stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            task.cancel()
        event = self._event()
        if event is not None:
            return event
        return Outcome.HEALTHY if task.result() else Outcome.UNHEALTHY

    def close(self) -> None:
        self.exit.cancel()
        self.stop.cancel()


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
        self.state = State.STOPPED
        self.since = time.time()
        self._since_mono = time.monotonic()
        self.restarts = 0
        self.rapid_failures = 0
        self.last_exit: str | None = None
        self.proc: ManagedProcess | None = None
        self.urgent = asyncio.Event()  # set by a second Ctrl-C: skip the rest of the grace period
        # Called after every move with (old, new), inside the loop: observers must not block.
        self.on_transition: Callable[[State, State], None] | None = None

    # -- observation ------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def elapsed(self) -> float:
        return time.monotonic() - self._since_mono

    def snapshot(self) -> dict[str, Any]:
        return {"name": self.name, "state": self.state.value, "pid": self.pid, "restarts": self.restarts,
                "url": self.url, "since": self.since, "elapsed_s": round(self.elapsed(), 1),
                "last_exit": self.last_exit}

    def _say(self, message: str) -> None:
        if self._console is not None:
            self._console.write(f"[fleet] {self.name}: {message}\n")
            self._console.flush()

    def _set(self, new: State) -> None:
        old = self.state
        check_transition(old, new)
        took = self.elapsed()
        self.state, self.since, self._since_mono = new, time.time(), time.monotonic()
        if self._metrics is not None:
            self._metrics.set_state(self.name, new)
        detail = f" after {took:.1f}s" if old in (State.STARTING, State.RUNNING, State.BACKOFF) else ""
        self._say(f"{old.value} -> {new.value}{detail}")
        if self.on_transition is not None:
            self.on_transition(old, new)

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
                    self._set(State.STOPPING)
                self._set(State.STOPPED)

    async def _loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._set(State.STARTING)
            outcome, ran_s = await self._one_run(stop)
            if outcome is Outcome.STOP:
                self._set(State.STOPPING)
                return
            self._set(State.EXITED)
            self._say(self.last_exit or "failed")
            await self._stop_proc()
            if stop.is_set():
                self._set(State.STOPPING)
                return
            if ran_s >= self._cfg.start_secs:
                self.rapid_failures = 0  # it ran long enough: this failure is not part of a crash loop
                attempt = 1
            else:
                self.rapid_failures += 1
                attempt = self.rapid_failures
            if self.rapid_failures > self._cfg.start_retries:
                self._set(State.FATAL)
                self._say(f"gave up after {self.rapid_failures} rapid failures in a row (start_retries="
                          f"{self._cfg.start_retries}); it stays down until the fleet is restarted")
                return
            delay = backoff_delay(self._cfg, attempt)
            self._set(State.BACKOFF)
            self._say(f"restarting in {delay:.1f}s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            if stop.is_set():
                self._set(State.STOPPING)
                return
            self.restarts += 1
            if self._metrics is not None:
                self._metrics.count_restart(self.name)

    async def _one_run(self, stop: asyncio.Event) -> tuple[Outcome, float]:
        """Start once; return why the run ended and how long it was RUNNING."""
        proc = ManagedProcess(self.spec, self._console)
        try:
            await proc.start()
        except OSError as e:
            self.last_exit = f"cannot start {self.spec.argv[0]!r}: {e.strerror or e}"
            return Outcome.EXITED, 0.0
        self.proc = proc
        watch = _Watch(proc, stop)
        try:
            outcome = await self._await_healthy(watch)
            if outcome is not Outcome.HEALTHY:
                return self._ended(outcome, "while starting"), 0.0
            self._set(State.RUNNING)
            started = time.monotonic()
            outcome = await self._monitor(watch)
            return self._ended(outcome, "while running"), time.monotonic() - started
        finally:
            watch.close()

    def _ended(self, outcome: Outcome, when: str) -> Outcome:
        if outcome is Outcome.EXITED:
            self.last_exit = f"exited with code {self.proc.returncode if self.proc else '?'} {when}"
        return outcome

    async def _await_healthy(self, watch: _Watch) -> Outcome:
        cfg = self._cfg
        deadline = time.monotonic() + cfg.startup_timeout_s
        # Polling a port that refuses connections is nearly free, and every poll interval is added
        # to every restart: poll faster while starting than while running.
        poll = min(cfg.health_interval_s, 0.25)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.last_exit = (f"no 200 from {self.spec.health_url} within "
                                  f"startup_timeout_s={cfg.startup_timeout_s:g}")
                return Outcome.UNHEALTHY
            outcome = await watch.probe(self._probe(min(cfg.health_timeout_s, remaining)))
            if outcome is not Outcome.UNHEALTHY:
                return outcome
            event = await watch.pause(min(poll, deadline - time.monotonic()))
            if event is not None:
                return event

    async def _monitor(self, watch: _Watch) -> Outcome:
        cfg = self._cfg
        failed = 0
        while True:
            event = await watch.pause(cfg.health_interval_s)
            if event is not None:
                return event
            outcome = await watch.probe(self._probe(cfg.health_timeout_s))
            if outcome in (Outcome.EXITED, Outcome.STOP):
                return outcome
            failed = 0 if outcome is Outcome.HEALTHY else failed + 1
            if failed >= cfg.health_failures:
                self.last_exit = f"{failed} health probes in a row failed"
                return Outcome.UNHEALTHY

    async def _probe(self, timeout_s: float) -> bool:
        try:
            timeout = aiohttp.ClientTimeout(total=timeout_s)
            async with self._session.get(self.spec.health_url, timeout=timeout, allow_redirects=False) as resp:
                return resp.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False

    async def _stop_proc(self) -> None:
        proc = self.proc
        if proc is None:
            return
        try:
            if not await proc.stop(self._cfg.stop_grace_s, self.urgent):
                self._say(f"process group {proc.pid} survived SIGKILL (stuck in the kernel?)")
        finally:
            self.proc = None  # pid stays visible in /instances until the group is gone
