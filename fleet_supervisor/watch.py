"""Racing every wait of one run of a child against what can end it: the process exiting, a stop
being requested, and (where the loop takes them) commands to sleep, wake or restart."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from enum import Enum
from typing import Any

from tenacity import RetryCallState, Retrying, wait_exponential

from fleet_supervisor.process import ManagedProcess
from fleetspec.fleetfile import SupervisorSection


class Outcome(Enum):
    HEALTHY = "healthy"  # also: the awaited step finished
    UNHEALTHY = "unhealthy"  # a probe failed (one probe while running; the deadline while starting)
    EXITED = "exited"
    STOP = "stop"
    COMMAND = "command"  # a command the loop takes at this point is pending
    SLEPT = "slept"  # cold sleep: the group was stopped on purpose, the instance is SLEEPING
    RESTART = "restart"  # a planned restart: the group was stopped on purpose, the instance is STOPPED


def backoff_delay(cfg: SupervisorSection, attempt: int) -> float:
    """Delay before restart number ``attempt`` (1-based) of a run of failures: initial * 2**(n-1),
    capped at backoff_max_s — tenacity's wait_exponential, so the curve is the usual one."""
    wait = wait_exponential(multiplier=cfg.backoff_initial_s, min=cfg.backoff_initial_s, max=cfg.backoff_max_s)
    retry_state = RetryCallState(Retrying(), None, (), {})
    retry_state.attempt_number = max(1, attempt)
    return float(wait(retry_state))


class Watch:
    """One run's races. ``pending`` says whether a command this phase takes is waiting: the
    instance loop sets ``nudge`` whenever a command arrives, and each phase decides what it takes."""

    def __init__(self, proc: ManagedProcess | None, stop: asyncio.Event, nudge: asyncio.Event) -> None:
        self.exit: asyncio.Task[Any] = asyncio.create_task(proc.wait() if proc else asyncio.Event().wait())
        self.stop = asyncio.create_task(stop.wait())
        self._nudge = nudge
        self._nudged: asyncio.Task[Any] | None = None

    def _event(self, pending: Callable[[], bool] | None) -> Outcome | None:
        if self.stop.done():
            return Outcome.STOP
        if self.exit.done():
            return Outcome.EXITED
        if pending is not None and self._nudge.is_set():
            self._nudge.clear()
            if pending():
                return Outcome.COMMAND
        return None

    def _waits(self, pending: Callable[[], bool] | None) -> set[asyncio.Task[Any]]:
        waits = {self.exit, self.stop}
        if pending is not None:
            if self._nudged is None or self._nudged.done():
                self._nudged = asyncio.create_task(self._nudge.wait())
            waits.add(self._nudged)
        return waits

    async def pause(self, seconds: float, pending: Callable[[], bool] | None = None) -> Outcome | None:
        """Sleep ``seconds`` unless something ends it first; None when the time simply passed."""
        deadline = asyncio.get_running_loop().time() + max(0.0, seconds)
        while True:
            event = self._event(pending)
            if event is not None:
                return event
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return None
            await asyncio.wait(self._waits(pending), timeout=left, return_when=asyncio.FIRST_COMPLETED)

    async def until(self, step: Coroutine[Any, Any, Any], pending: Callable[[], bool] | None = None
                    ) -> tuple[Outcome | None, Any]:
        """Run ``step`` unless something ends it first: (None, its result) or (the event, None).
        An exception of ``step`` propagates."""
        task = asyncio.ensure_future(step)
        try:
            while True:
                event = self._event(pending)
                if event is not None:
                    return event, None
                await asyncio.wait({task, *self._waits(pending)}, return_when=asyncio.FIRST_COMPLETED)
                if task.done():
                    return None, task.result()
        finally:
            task.cancel()

    async def probe(self, check: Coroutine[Any, Any, bool], pending: Callable[[], bool] | None = None) -> Outcome:
        event, ok = await self.until(check, pending)
        if event is not None:
            return event
        return Outcome.HEALTHY if ok else Outcome.UNHEALTHY

    def close(self) -> None:
        for t in (self.exit, self.stop, self._nudged):
            if t is not None:
                t.cancel()
