"""The swap ledger's start-up order (fleet_supervisor/swap.py): on a shared device a preloaded
instance loads only once the unpreloaded sleepers beside it have loaded and gone to sleep, whatever
the order of the fleet file, so that it is the one awake after start-up."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from fleet_supervisor.state import State
from fleet_supervisor.swap import Swapper
from fleetspec.sleep import SleepSection, SwapSection


@dataclass(eq=False)
class Stub:
    name: str
    preload: bool
    devices: list[str] = field(default_factory=lambda: ["2", "3"])
    share: float = 0.9
    state: State = State.STOPPED
    woke_at: float = 0.0
    asked: list[str] = field(default_factory=list)

    @property
    def models(self) -> list[str]:
        return [f"m-{self.name}"]

    @property
    def sleep_cfg(self) -> SleepSection:
        return SleepSection(preload=self.preload)

    def request_sleep(self, reason: str) -> None:
        self.asked.append(f"sleep:{reason}")

    def request_wake(self, reason: str) -> None:
        self.asked.append(f"wake:{reason}")


def move(s: Swapper, inst: Stub, *states: State) -> None:
    for new in states:
        old, inst.state = inst.state, new
        s.transition(inst, old, new)


async def test_the_preloaded_one_loads_after_the_sleeper_beside_it() -> None:
    awake, sleeper, other = Stub("l8", preload=True), Stub("m7", preload=False), Stub("q14", True, ["0", "1"])
    s = Swapper([awake, sleeper, other], SwapSection(), hub=None)  # the fleet file's order
    first = asyncio.create_task(s.admit(awake))
    await asyncio.wait_for(s.admit(other), 1)  # other devices: not held up
    await asyncio.sleep(0.05)
    assert not first.done(), "the preloaded instance loaded before the sleeper beside it"
    await asyncio.wait_for(s.admit(sleeper), 1)
    move(s, sleeper, State.STARTING, State.RUNNING)
    assert sleeper.asked == ["sleep:startup"] and not first.done()
    move(s, sleeper, State.DRAINING, State.SLEEPING)
    await asyncio.wait_for(first, 1)
    move(s, awake, State.STARTING, State.RUNNING)
    assert awake.asked == [] and s.resident() == ["l8", "q14"]
    # Later (a crash, a restart) it does not wait again: its first start is over.
    move(s, awake, State.EXITED, State.BACKOFF)
    await asyncio.wait_for(s.admit(awake), 1)


async def test_a_sleeper_that_fails_to_start_does_not_hold_the_preloaded_one_back() -> None:
    awake, sleeper = Stub("l8", preload=True), Stub("m7", preload=False)
    s = Swapper([awake, sleeper], SwapSection(), hub=None)
    first = asyncio.create_task(s.admit(awake))
    await asyncio.wait_for(s.admit(sleeper), 1)
    move(s, sleeper, State.STARTING, State.EXITED, State.FATAL)
    await asyncio.wait_for(first, 1)


async def test_a_cold_sleeper_that_never_starts_lets_the_preloaded_one_load() -> None:
    """Cold and not preloaded: it goes from STOPPED straight to SLEEPING and loads on demand only."""
    awake, sleeper = Stub("a", preload=True), Stub("b", preload=False)
    s = Swapper([awake, sleeper], SwapSection(), hub=None)
    first = asyncio.create_task(s.admit(awake))
    await asyncio.sleep(0.05)
    assert not first.done()
    move(s, sleeper, State.SLEEPING)
    await asyncio.wait_for(first, 1)


class Hub:
    """The control hub as the ledger reads it: requests waiting per model, nothing in flight."""

    def __init__(self) -> None:
        self.waiting: dict[str, int] = {}

    def demand(self, model: str) -> int:
        return self.waiting.get(model, 0)

    def wanted_models(self) -> list[str]:
        return [m for m, n in self.waiting.items() if n]

    def in_flight(self, instance: str) -> int:
        return 0

    def last_request(self, instance: str) -> float:
        return 0.0


async def test_a_sleeper_kept_awake_by_demand_yields_to_the_preloaded_one_once_idle() -> None:
    """Requests for the sleeper during start-up keep it RUNNING; once it has loaded, the preloaded
    one's start makes room as any admit does: the sleeper, idle again, is put to sleep for it."""
    hub = Hub()
    hub.waiting["m-b"] = 1
    awake, sleeper = Stub("a", preload=True), Stub("b", preload=False)
    s = Swapper([awake, sleeper], SwapSection(), hub=hub)
    first = asyncio.create_task(s.admit(awake))
    await asyncio.wait_for(s.admit(sleeper), 1)
    move(s, sleeper, State.STARTING, State.RUNNING)
    assert sleeper.asked == [] and not first.done()  # wanted: not asked to sleep at start-up
    hub.waiting.clear()
    sleeper.woke_at = time.time() - 5  # served its requests, idle since
    s.decide()
    assert sleeper.asked == ["sleep:swap"]
    move(s, sleeper, State.DRAINING, State.SLEEPING)
    await asyncio.wait_for(first, 1)
