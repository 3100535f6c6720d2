"""Taking an instance out of service on purpose, without cutting a request (state.py: DRAINING).

The instance moves to DRAINING: a new epoch, sent to every gateway over the control channel. The
gateways stop routing to it (streams migrate where another replica can continue them) and each
acknowledges the epoch once nothing of its own is in flight there. The engine's own /metrics must
then show nothing running or waiting (a request already in the socket as the drain began). Only
then may it sleep (sleeping.py), restart or stop (a reload, an admin restart).
"""

from __future__ import annotations

import asyncio
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
    while not await sleepmode.engine_idle(session, base):  # noqa: ASYNC110
        await asyncio.sleep(_IDLE_POLL_S)


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
