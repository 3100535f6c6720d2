"""The sleep half of an instance's lifecycle: drain, sleep, wait, get budget, wake (state.py).

Two modes, one policy (fleetspec/sleep.py): ``vllm`` uses vLLM's sleep mode, so the process, its
CUDA context and compiled kernels stay and only the GPU memory goes; ``cold`` stops the process
group and starts it again, for engines without sleep mode (the CPU build, any other command).

A drain comes first, always (drain.py), so a sleep never cuts a request, and a request never
reaches a sleeping vLLM (which would hang, DESIGN §3).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import aiohttp

from fleet_supervisor import sleepmode
from fleet_supervisor.drain import drain
from fleet_supervisor.metrics import FleetMetrics
from fleet_supervisor.state import State
from fleet_supervisor.watch import Outcome, Watch

if TYPE_CHECKING:
    from fleet_supervisor.instance import InstanceSupervisor

_SLEEP_CALL_S = 120.0  # one POST /sleep (level 1 copies the weights to host RAM: 2.5 s for 5.6 GB)


class SleepCycle:
    def __init__(self, inst: InstanceSupervisor, session: aiohttp.ClientSession,
                 metrics: FleetMetrics | None) -> None:
        assert inst.spec.sleep is not None
        self.inst = inst
        self.plan = inst.spec.sleep
        self._session = session
        self._metrics = metrics
        self.wake_asked_at = 0.0
        self._base = inst.spec.health_url.removesuffix("/health")

    def starts_asleep(self) -> bool:
        """A cold sleeper that is not preloaded is first started by the first request for it."""
        return self.plan.mode == "cold" and not self.plan.cfg.preload

    async def await_wake(self, stop: asyncio.Event) -> bool:
        """SLEEPING with no process (cold): until a wake is asked (True) or a stop (False)."""
        inst = self.inst
        while inst.target != "awake":
            nudged = asyncio.create_task(inst.nudge.wait())
            halt = asyncio.create_task(stop.wait())
            try:
                await asyncio.wait({nudged, halt}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                nudged.cancel()
                halt.cancel()
            if stop.is_set():
                return False
            inst.nudge.clear()
        return not stop.is_set()

    def woke(self) -> None:
        if self._metrics is not None and self.wake_asked_at:
            self._metrics.observe_wake(self.inst.name, self.plan.mode, time.monotonic() - self.wake_asked_at)
        self.wake_asked_at = 0.0

    async def sleep_and_wake(self, watch: Watch) -> Outcome:
        """From RUNNING with a sleep asked. HEALTHY: RUNNING again (woken, or the sleep called
        off); SLEPT: cold sleep, group stopped; anything else ends the run."""
        inst = self.inst
        outcome = await drain(inst, watch, self._session,
                              lambda: inst.target == "awake" and not inst.restart_wanted and not inst.retire_wanted)
        if outcome is Outcome.COMMAND:
            return Outcome.HEALTHY
        if outcome is not Outcome.HEALTHY:
            return outcome
        if self.plan.mode == "cold":
            async with inst.memory():
                await inst.stop_proc()
            inst.set(State.SLEEPING)
            return Outcome.SLEPT
        try:
            async with inst.memory():
                await sleepmode.sleep(self._session, self._base, self.plan.level, _SLEEP_CALL_S)
        except sleepmode.SleepModeError as e:
            inst.last_exit = f"could not sleep: {e}"
            return Outcome.UNHEALTHY
        inst.set(State.SLEEPING)
        # Asleep, vLLM still answers /health: probes catch a dead process, as while running.
        outcome = await inst.monitor(watch, lambda: inst.target == "awake")
        if outcome is not Outcome.COMMAND:
            return outcome
        if inst.swapper is not None:
            event, _ = await watch.until(inst.swapper.admit(inst))
            if event is not None:
                return event
        inst.set(State.WAKING)
        limit = self.plan.cfg.wake_timeout_s
        try:
            async with inst.memory():
                event, _ = await watch.until(asyncio.wait_for(
                    sleepmode.wake(self._session, self._base, self.plan.level, limit), limit))
        except (sleepmode.SleepModeError, TimeoutError) as e:
            inst.last_exit = f"wake failed ({e or f'no answer within wake_timeout_s={limit:g}'}); restarting it cold"
            return Outcome.UNHEALTHY
        if event is not None:
            return event
        self.woke()
        inst.set(State.RUNNING)
        return Outcome.HEALTHY
