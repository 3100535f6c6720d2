"""The swap policy: which sleep-capable instance may hold memory, and which must give it back.

It owns one thing, the **budget ledger**: the instances that hold their share of their devices
(fleetspec/sleep.py). An instance loop asks ``admit`` before it loads weights (a start, a wake) and
the ledger lets it go once the instance sleeps, stops or fails. Everything else it does is to ask
instance loops, which own their state, to ``request_sleep`` or ``request_wake``:

- **Demand.** Requests wait in a gateway for a model with no awake replica (the control hub's
  demand): one of its sleeping instances is asked to wake.
- **Room.** An admit that does not fit makes room: the least recently used *idle* instance (nothing
  in flight, no request for ``QUIET_S``) on the same devices is put to sleep first (drained, so
  nothing in flight is ever cut). One with requests
  in flight is drained only once requests for the waking model have waited ``swap.hold_s``: until
  then it keeps serving its own queue together (no thrash), after that it gets no new requests (no
  starvation). An instance just woken counts as used at its wake, so it serves what woke it first.
- **One memory operation per device at a time** (``memory``): a start, a sleep or a wake holds the
  lock of each of its devices. vLLM measures device-wide free memory around these (its sleep
  asserts that free memory grew, its start profiles what is free), so another process allocating
  or freeing on the same GPU meanwhile makes it fail: seen on H200, where a wake of one instance
  during the sleep of another killed the sleeper's engine ("Memory usage increased after
  sleeping").
- **Idle.** An awake instance with nothing in flight for ``sleep.idle_s`` since its last request (or
  its wake) goes to sleep; one that reached RUNNING at start-up without being asked for (and is not
  ``preload``) goes to sleep at once.
- **Start-up order.** A ``preload`` instance starts only once the sleepers beside it that are not
  preloaded have loaded and gone to sleep: each of them needs the memory to start (vLLM profiles
  what is free), and had the preloaded one started first, it would have been put to sleep to make
  that room and stayed asleep after start-up (seen with Seed 001's layout, the preloaded model
  listed first on GPUs 2,3).

Instances without a ``sleep:`` block are not in the ledger and never asked anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable
from typing import Protocol

from fleet_supervisor.hub import ControlHub
from fleet_supervisor.metrics import FleetMetrics
from fleet_supervisor.state import State
from fleetspec.sleep import SleepSection, SwapSection

log = logging.getLogger("fleet.swap")
_EPS = 1e-9
_TICK_S = 0.5  # idle and hold timers are checked this often; events are handled at once
# Idle: nothing in flight and no request for this long. Activity reaches the policy in snapshots
# (every 0.5 s), so "nothing in flight right now" alone would call a busy model idle between two
# back-to-back requests.
QUIET_S = 1.0


class Swappable(Protocol):
    """What the policy reads of an instance loop (instance.py) and may ask of it."""

    name: str
    state: State
    models: list[str]
    devices: list[str]
    share: float
    sleep_cfg: SleepSection | None
    woke_at: float  # wall clock of the last RUNNING after a wake or start; 0 before

    def request_sleep(self, reason: str) -> None: ...

    def request_wake(self, reason: str) -> None: ...


class Swapper:
    def __init__(self, instances: Iterable[Swappable], swap: SwapSection, hub: ControlHub | None,
                 metrics: FleetMetrics | None = None) -> None:
        self._all = [i for i in instances if i.sleep_cfg is not None]
        self._metrics = metrics
        self._budget = swap.budget
        self._hold_s = swap.hold_s
        self._hub = hub
        self._resident: set[str] = set()
        self._admits: dict[str, asyncio.Future[None]] = {}  # in arrival order
        self._demand_since: dict[str, float] = {}
        self._sleeping_for: dict[str, str] = {}  # instance -> why it was asked to sleep
        self._locks: dict[str, asyncio.Lock] = {}
        self._settled: set[str] = set()  # first start over: loaded (RUNNING), asleep, failed or stopped

    def manages(self, inst: Swappable) -> bool:
        return inst in self._all

    def add(self, inst: Swappable) -> None:
        """A live reload added ``inst``: the ledger counts it from its first admit."""
        if inst.sleep_cfg is not None and inst not in self._all:
            self._all.append(inst)

    def remove(self, inst: Swappable) -> None:
        """A live reload removed ``inst`` (stopped): it holds nothing any more."""
        if inst in self._all:
            self._all.remove(inst)
            self._resident.discard(inst.name)
            self._sleeping_for.pop(inst.name, None)
            self.decide()

    def configure(self, swap: SwapSection) -> None:
        self._budget = swap.budget
        self._hold_s = swap.hold_s
        self.decide()

    # -- the ledger -------------------------------------------------------------------------------

    async def admit(self, inst: Swappable) -> None:
        """Return once ``inst`` holds its share; waits (making room) while it does not fit."""
        if not self.manages(inst) or inst.name in self._resident:
            return
        fut = self._admits.get(inst.name)
        if fut is None or fut.done():
            fut = self._admits[inst.name] = asyncio.get_running_loop().create_future()
        self.decide()
        try:
            await asyncio.shield(fut)
        finally:
            if self._admits.get(inst.name) is fut and not fut.done():
                del self._admits[inst.name]  # the loop gave up waiting (a stop): not a claim any more

    @contextlib.asynccontextmanager
    async def memory(self, inst: Swappable) -> AsyncIterator[None]:
        """Hold every device of ``inst`` for one memory operation (a start, a sleep, a wake)."""
        if not self.manages(inst):
            yield
            return
        async with contextlib.AsyncExitStack() as stack:
            for d in sorted(inst.devices):  # one order for everybody: no deadlock
                await stack.enter_async_context(self._locks.setdefault(d, asyncio.Lock()))
            yield

    def release(self, inst: Swappable) -> None:
        if inst.name in self._resident:
            self._resident.discard(inst.name)
            log.info("%s gave back its share", inst.name)
        self.decide()

    def resident(self) -> list[str]:
        return sorted(self._resident)

    # -- events -----------------------------------------------------------------------------------

    def transition(self, inst: Swappable, old: State, new: State) -> None:
        if not self.manages(inst):
            return
        if new in (State.SLEEPING, State.BACKOFF, State.STOPPED, State.FATAL, State.RUNNING):
            self._settled.add(inst.name)
            self._sleeping_for.pop(inst.name, None)  # asked and done, or called off
        if new in (State.SLEEPING, State.BACKOFF, State.STOPPED, State.FATAL):
            self.release(inst)
            return
        if new is State.RUNNING and old is State.STARTING and inst.sleep_cfg is not None \
                and not inst.sleep_cfg.preload and not self._wanted(inst):
            self._ask_sleep(inst, "startup")
        self.decide()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(_TICK_S)
            self.decide()

    # -- the decisions ----------------------------------------------------------------------------

    def _wanted(self, inst: Swappable) -> bool:
        return self._hub is not None and any(self._hub.demand(m) > 0 for m in inst.models)

    def _waited(self, inst: Swappable, now: float) -> float:
        """How long requests for ``inst``'s models have waited, or 0."""
        since = [self._demand_since[m] for m in inst.models if m in self._demand_since]
        return now - min(since) if since else 0.0

    def decide(self) -> None:
        now = time.monotonic()
        wanted = set(self._hub.wanted_models()) if self._hub is not None else set()
        for m in list(self._demand_since):
            if m not in wanted:
                del self._demand_since[m]
        for m in wanted:
            self._demand_since.setdefault(m, now)
            self._wake_for(m)
        for name in list(self._admits):
            inst = self._find(name)
            fut = self._admits[name]
            if inst is None or fut.done() or self._first_start_waits(inst):
                continue
            if self._fits(inst):
                self._resident.add(name)
                del self._admits[name]
                fut.set_result(None)
                log.info("%s holds its share (%s)", name, self._usage_text(inst))
            else:
                self._make_room(inst, now)
        self._sleep_idle()

    def _first_start_waits(self, inst: Swappable) -> bool:
        """A preloaded instance's first start waits for the unpreloaded sleepers beside it to load (then
        they are asked to sleep, and it waits for their memory as any admit does) or to fail."""
        if inst.sleep_cfg is None or not inst.sleep_cfg.preload or inst.name in self._settled:
            return False
        return any(j.sleep_cfg is not None and not j.sleep_cfg.preload and j.name not in self._settled
                   for j in self._beside(inst))

    def _wake_for(self, model: str) -> None:
        group = [i for i in self._all if model in i.models]
        if any(i.state in (State.RUNNING, State.STARTING, State.WAKING) for i in group):
            return
        for i in group:
            if i.state is State.DRAINING and self._sleeping_for.get(i.name) == "idle":
                i.request_wake("demand")  # asked to sleep for idleness, wanted again: call it off
                return
        asleep = [i for i in group if i.state is State.SLEEPING]
        if asleep and not any(i.name in self._admits for i in group):
            asleep[0].request_wake("demand")

    def _fits(self, inst: Swappable) -> bool:
        return all(self._used(d) + inst.share <= self._budget + _EPS for d in inst.devices)

    def _used(self, device: str) -> float:
        return sum(i.share for i in self._all if i.name in self._resident and device in i.devices)

    def _beside(self, inst: Swappable) -> list[Swappable]:
        return [i for i in self._all if i is not inst and set(i.devices) & set(inst.devices)]

    def _make_room(self, inst: Swappable, now: float) -> None:
        hub = self._hub
        freeing = [i for i in self._beside(inst) if i.name in self._resident and i.state is State.DRAINING]
        candidates = [i for i in self._beside(inst) if i.name in self._resident and i.state is State.RUNNING
                      and i.name not in self._admits]

        wall = time.time()

        def last_used(i: Swappable) -> float:
            return max(hub.last_request(i.name) if hub is not None else 0.0, i.woke_at)

        def busy(i: Swappable) -> bool:
            return hub is not None and (hub.in_flight(i.name) > 0 or self._wanted(i) or wall - last_used(i) < QUIET_S)

        idle = sorted((i for i in candidates if not busy(i)), key=last_used)
        held_long_enough = self._waited(inst, now) >= self._hold_s
        order = idle + (sorted((i for i in candidates if busy(i)), key=last_used) if held_long_enough else [])
        chosen: list[Swappable] = []
        for victim in order:
            if self._fits_without(inst, freeing + chosen):
                break
            chosen.append(victim)
        if self._fits_without(inst, freeing + chosen):
            for victim in chosen:
                self._ask_sleep(victim, "swap")

    def _fits_without(self, inst: Swappable, leaving: list[Swappable]) -> bool:
        gone = {i.name for i in leaving}
        return all(sum(i.share for i in self._all if i.name in self._resident and i.name not in gone
                       and d in i.devices) + inst.share <= self._budget + _EPS for d in inst.devices)

    def _sleep_idle(self) -> None:
        wall = time.time()
        for i in self._all:
            cfg = i.sleep_cfg
            if cfg is None or cfg.idle_s is None or i.state is not State.RUNNING or self._wanted(i):
                continue
            hub = self._hub
            if hub is not None and hub.in_flight(i.name) > 0:
                continue
            last = max(hub.last_request(i.name) if hub is not None else 0.0, i.woke_at)
            if wall - last >= cfg.idle_s:
                self._ask_sleep(i, "idle")

    def _ask_sleep(self, inst: Swappable, reason: str) -> None:
        if self._sleeping_for.get(inst.name) is None:
            self.asked(inst, reason)
            inst.request_sleep(reason)

    def asked(self, inst: Swappable, reason: str) -> None:
        """Record a sleep asked for ``reason`` (here, or by an admin): counted, and not asked twice."""
        self._sleeping_for[inst.name] = reason
        log.info("asking %s to sleep (%s)", inst.name, reason)
        if self._metrics is not None:
            self._metrics.count_swap(reason)

    def _find(self, name: str) -> Swappable | None:
        return next((i for i in self._all if i.name == name), None)

    def _usage_text(self, inst: Swappable) -> str:
        return ", ".join(f"device {d}: {self._used(d):g}/{self._budget:g}" for d in inst.devices)
