"""Live changes: apply an edited fleet file to a running fleet (``vllm-fleet reload``, SIGHUP to ``up``).

The file is read and checked as ``up`` would check it (every rule, the host's GPUs, the ports: the
ports this fleet already listens on do not count as taken). A file that fails changes nothing and
says why. Otherwise, by instance name:

- **removed** instances drain (the gateways stop routing to them; streams move to another replica
  where one exists) and stop; then they leave the fleet, and the gateways drop them;
- **added** instances start, and the gateways take them up once their probes say so;
- **changed** instances (command line, environment, port, served names, sleep block) restart one
  at a time, each drained first, the next only once the previous one serves again, so a model
  with several replicas never loses all of them;
- **unchanged** instances are not touched.

``swap:`` applies at once; ``gateway:`` and ``supervisor:`` changes need a restart of ``up`` (the
reload says so rather than half-applying them).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleet_supervisor.command import LaunchSpec
from fleet_supervisor.plan import Plan
from fleet_supervisor.state import State

if TYPE_CHECKING:
    from fleet_supervisor.fleet import Fleet

log = logging.getLogger("fleet.reload")
UP_STATES = (State.RUNNING, State.SLEEPING)


@dataclass
class Diff:
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return {"added": self.added, "removed": self.removed, "changed": self.changed,
                "unchanged": self.unchanged, "notes": self.notes}

    def summary(self) -> str:
        parts = [f"{what} {', '.join(names)}" for what, names in
                 (("add", self.added), ("remove", self.removed), ("restart", self.changed)) if names]
        return "; ".join(parts) or "nothing to change"


def _same(a: LaunchSpec, b: LaunchSpec) -> bool:
    return (a.argv, a.env_overrides, a.health_url, a.models, a.sleep) == \
        (b.argv, b.env_overrides, b.health_url, b.models, b.sleep)


def diff(old: Plan, new: Plan) -> Diff:
    d = Diff()
    before = {s.name: s for s in old.instances}
    after = {s.name: s for s in new.instances}
    d.removed = [n for n in before if n not in after]
    d.added = [n for n in after if n not in before]
    for n in after:
        if n in before:
            (d.unchanged if _same(before[n], after[n]) else d.changed).append(n)
    for section in ("gateway", "supervisor", "vllm_command", "gateway_command", "vram_tier"):
        if getattr(old.fleet, section) != getattr(new.fleet, section):
            d.notes.append(f"{section}: changed in the file; it applies at the next start of `vllm-fleet up`")
    return d


class Reloader:
    """Applies one diff at a time; a second reload while one runs is refused."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet
        self._lock = asyncio.Lock()

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    async def apply(self, new: Plan, d: Diff) -> None:
        async with self._lock:
            fleet = self._fleet
            fleet.say(f"reload: {d.summary()}")
            for note in d.notes:
                fleet.say(f"reload: {note}")
            old = fleet.plan
            fleet.adopt_plan(new)  # swap budget and the Infernet JSON now; instances below
            await asyncio.gather(*(fleet.retire(name) for name in d.removed))
            specs = {s.name: (s, i) for s, i in zip(new.instances, new.fleet.instances, strict=True)}
            for name in d.added:
                fleet.add_instance(*specs[name])
            await asyncio.gather(*(self._until_up(name) for name in d.added))
            for name in d.changed:
                in_place = await fleet.replace(*specs[name])
                await self._until_up(name, restarted=in_place)
            fleet.say(f"reload done: {d.summary()}")
            del old

    async def _until_up(self, name: str, restarted: bool = False) -> None:
        """Until the instance serves (in every gateway's rotation; or sleeps, as a sleeper may), is
        FATAL, or its startup time passed. Only then may the next replica of a model go down."""
        fleet = self._fleet
        sup = fleet.find(name)
        if sup is None:
            return
        limit = fleet.plan.fleet.supervisor.startup_timeout_s + 60
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        seen_down = not restarted
        while loop.time() < deadline:
            if sup.state not in UP_STATES:
                seen_down = True
            elif seen_down and (sup.state is State.SLEEPING or fleet.hub is None
                                or fleet.hub.in_rotation(name, sup.epoch)):
                return
            if sup.state is State.FATAL:
                fleet.say(f"reload: {name} is FATAL; the rest of the reload goes on")
                return
            await asyncio.sleep(0.1)
        fleet.say(f"reload: {name} not up after {limit:g}s; the rest of the reload goes on")
