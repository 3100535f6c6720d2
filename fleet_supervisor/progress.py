"""What ``up`` says while the fleet comes up: "loading" lines while anything loads or waits to
restart, and one "ready" line the moment every child is first up."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from fleet_supervisor.instance import InstanceSupervisor
from fleet_supervisor.state import State


class Progress:
    def __init__(self, children: Callable[[], list[InstanceSupervisor]], say: Callable[[str], None]) -> None:
        self._children = children
        self._say = say
        self._started = time.monotonic()
        self._ready_said = False

    def transition(self, new: State, instances: int, gateway_url: str | None) -> None:
        """Say "ready" when every child is first up (RUNNING, or asleep where it may sleep)."""
        def up(c: InstanceSupervisor) -> bool:
            return c.state is State.RUNNING or (c.sleep_cfg is not None and c.state is State.SLEEPING)

        if new in (State.RUNNING, State.SLEEPING) and not self._ready_said and all(up(c) for c in self._children()):
            self._ready_said = True
            self._say(f"ready in {time.monotonic() - self._started:.1f}s: {instances} instances "
                      f"behind the gateway at {gateway_url or '?'}")

    async def run(self, interval: float) -> None:
        """While anything loads or waits to restart, one line every ``interval`` seconds."""
        while True:
            await asyncio.sleep(interval)
            children = self._children()
            if any(c.state in (State.STARTING, State.BACKOFF) for c in children):
                self._say("loading: " + ", ".join(f"{c.name} {c.state.value} {c.elapsed():.0f}s" for c in children))
