"""Taking an instance out of service on purpose, without cutting a request (state.py: DRAINING).

The instance moves to DRAINING: a new epoch, sent to every gateway over the control channel. The
gateways stop routing to it (streams migrate where another replica can continue them) and each
acknowledges the epoch once nothing of its own is in flight there. The engine's own /metrics must
then show nothing running or waiting (a request already in the socket as the drain began). Only
then may it sleep (sleeping.py), restart or stop (a reload, an admin restart).

Or nothing moving: vLLM with several API servers can leave ``num_requests_running`` above 0 after
many streams are cut at once, its token counters flat, until its next request
(bench/gpu/results/cut-gauges-h200), and a draining instance gets none. So busy gauges whose
counters have not moved for ``drain_stalled_s`` count as drained. A request that runs moves them
every engine step; only a prefill that long with nothing else decoding does not.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import aiohttp

from fleet_supervisor import sleepmode
from fleet_supervisor.state import State
from fleet_supervisor.watch import Outcome, Watch

if TYPE_CHECKING:
    from fleet_supervisor.instance import InstanceSupervisor

_IDLE_POLL_S = 0.05


async def drain(inst: InstanceSupervisor, watch: Watch, session: aiohttp.ClientSession,
                called_off: Callable[[], bool] | None = None) -> Outcome:
    """RUNNING -> DRAINING -> drained: HEALTHY. COMMAND: ``called_off()`` became true, RUNNING again."""
    inst.set(State.DRAINING)
    event, _ = await watch.until(_drained(inst, inst.epoch, session), called_off)
    if event is Outcome.COMMAND:
        inst.set(State.RUNNING)
        inst.say("drain called off: wanted again")
    return event or Outcome.HEALTHY


async def _drained(inst: InstanceSupervisor, epoch: int, session: aiohttp.ClientSession) -> None:
    if inst.hub is not None:
        await inst.hub.wait_drained(inst.name, epoch)
    # The gateways' word covers what they sent; the engine's covers what reached it by any other
    # way. Nothing notifies: poll, briefly.
    base = inst.spec.health_url.removesuffix("/health")
    stall = Stall(inst.drain_stalled_s)
    while True:
        load = await sleepmode.engine_load(session, base)
        if load is not None:
            busy, tokens = load
            if busy == 0:
                return
            if stall.seen(busy, tokens, time.monotonic()):
                inst.say(f"drained: vLLM's /metrics still says {busy:g} running or waiting, but no token has "
                         f"moved for {stall.limit_s:g} s (gauges left up after cut streams)")
                return
        await asyncio.sleep(_IDLE_POLL_S)


class Stall:
    """Busy with the token counters flat: since when, and whether for ``limit_s`` (0: never)."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self._flat: tuple[float, float] | None = None  # (the counters' sum, since when)

    def seen(self, busy: float, tokens: float | None, now: float) -> bool:
        if busy == 0 or tokens is None or self.limit_s <= 0:
            self._flat = None
            return False
        if self._flat is None or self._flat[0] != tokens:
            self._flat = (tokens, now)
        return now - self._flat[1] >= self.limit_s


async def planned_stop(inst: InstanceSupervisor, watch: Watch, session: aiohttp.ClientSession,
                       why: str) -> Outcome:
    """Drain, then stop the group: STOPPED (HEALTHY), or what ended the drain first."""
    outcome = await drain(inst, watch, session)
    if outcome is not Outcome.HEALTHY:
        return outcome
    inst.set(State.STOPPING)
    await inst.stop_proc()
    inst.set(State.STOPPED)
    inst.say(why)
    return Outcome.HEALTHY
