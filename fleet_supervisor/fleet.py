"""The whole fleet in one event loop: every instance, the gateway, the endpoint, progress lines.

As in uvicorn's supervisors, signal handlers only set an event and one loop does the work: the
first SIGINT/SIGTERM asks for a stop, a second one cuts the grace periods short. Shutdown stops
the gateway first, so requests in flight can finish against backends that are still up, then
every instance in parallel, and returns only when every process group is empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from typing import Any, TextIO

import aiohttp

from fleet_supervisor.command import gateway_address
from fleet_supervisor.endpoint import Endpoint
from fleet_supervisor.instance import InstanceSupervisor
from fleet_supervisor.metrics import FleetMetrics
from fleet_supervisor.plan import Plan, write_infernet
from fleet_supervisor.process import become_subreaper
from fleet_supervisor.state import State

_GATEWAY_STARTUP_S = 120.0  # the gateway needs no model; a long deadline would only hide a hang


class Fleet:
    def __init__(self, plan: Plan, console: TextIO | None = None) -> None:
        self.plan = plan
        self.console = console if console is not None else sys.stdout
        self.stop = asyncio.Event()
        self.instances: list[InstanceSupervisor] = []
        self.gateway: InstanceSupervisor | None = None
        self.metrics = FleetMetrics([s.name for s in plan.instances] + [plan.gateway.name])
        self.endpoint: Endpoint | None = None
        self._started = time.monotonic()
        self._ready_said = False

    def _say(self, message: str) -> None:
        self.console.write(f"[fleet] {message}\n")
        self.console.flush()

    def children(self) -> list[InstanceSupervisor]:
        return self.instances + ([self.gateway] if self.gateway is not None else [])

    def snapshot(self) -> list[dict[str, Any]]:
        return [c.snapshot() for c in self.children()]

    def request_stop(self) -> None:
        """Signal handler body: first call stops gracefully, later ones skip the grace period."""
        if self.stop.is_set():
            for child in self.children():
                child.urgent.set()
        else:
            self.stop.set()

    def _install_signals(self) -> list[signal.Signals]:
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_stop)
                installed.append(sig)
        return installed

    async def run(self, install_signals: bool = True) -> int:
        plan = self.plan
        sup = plan.fleet.supervisor
        installed = self._install_signals() if install_signals else []
        become_subreaper()
        path = write_infernet(plan)
        self._say(f"wrote {path} ({len(plan.instances)} instances, node tier {plan.infernet['vram_tier']})")
        gw_cfg = sup.model_copy(update={"startup_timeout_s": min(sup.startup_timeout_s, _GATEWAY_STARTUP_S)})
        host, port = gateway_address(plan.fleet, plan.gateway.env)
        try:
            async with aiohttp.ClientSession() as session:
                self.instances = [
                    InstanceSupervisor(spec, sup, session, url=inst.url, metrics=self.metrics, console=self.console)
                    for spec, inst in zip(plan.instances, plan.fleet.instances, strict=True)
                ]
                self.gateway = InstanceSupervisor(plan.gateway, gw_cfg, session, url=f"http://{host}:{port}",
                                                  metrics=self.metrics, console=self.console)
                for child in self.children():
                    child.on_transition = self._on_transition
                await self._start_endpoint()
                await self._supervise()
        finally:
            if self.endpoint is not None:
                await self.endpoint.close()
            loop = asyncio.get_running_loop()
            for sig in installed:
                loop.remove_signal_handler(sig)
        self._say("stopped; no process left")
        return 0

    async def _start_endpoint(self) -> None:
        sup = self.plan.fleet.supervisor
        if not sup.metrics_port:
            return
        endpoint = Endpoint(self.metrics, self.snapshot, sup.metrics_host, sup.metrics_port)
        try:
            await endpoint.start()
        except OSError as e:  # checked free at startup; lost a race since: run without it
            self._say(f"metrics endpoint {endpoint.url} not started: {e.strerror or e}")
            return
        self.endpoint = endpoint
        self._say(f"supervisor endpoint {endpoint.url}/metrics and /instances")

    async def _supervise(self) -> None:
        gateway = self.gateway
        assert gateway is not None
        inst_stop, gw_stop = asyncio.Event(), asyncio.Event()
        inst_tasks = [asyncio.create_task(c.run(inst_stop), name=f"instance-{c.name}") for c in self.instances]
        gw_task = asyncio.create_task(gateway.run(gw_stop), name="gateway")
        progress = asyncio.create_task(self._progress(), name="progress")
        try:
            await self.stop.wait()
        finally:
            self._say("stopping: gateway first, then every instance")
            progress.cancel()
            gw_stop.set()
            await asyncio.gather(gw_task, return_exceptions=True)
            inst_stop.set()
            for res in await asyncio.gather(*inst_tasks, return_exceptions=True):
                if isinstance(res, BaseException) and not isinstance(res, asyncio.CancelledError):
                    self._say(f"an instance loop failed: {res!r}")

    def _on_transition(self, _old: State, new: State) -> None:
        """Say "ready" the moment the last child first reaches RUNNING."""
        if new is State.RUNNING and not self._ready_said and all(c.state is State.RUNNING for c in self.children()):
            self._ready_said = True
            gw = self.gateway.url if self.gateway else "?"
            self._say(f"ready in {time.monotonic() - self._started:.1f}s: {len(self.instances)} instances "
                      f"behind the gateway at {gw}")

    async def _progress(self) -> None:
        """While anything loads or waits to restart, one line every progress_interval_s."""
        interval = self.plan.fleet.supervisor.progress_interval_s
        while True:
            await asyncio.sleep(interval)
            children = self.children()
            if any(c.state in (State.STARTING, State.BACKOFF) for c in children):
                self._say("loading: " + ", ".join(f"{c.name} {c.state.value} {c.elapsed():.0f}s" for c in children))


async def run_fleet(plan: Plan, console: TextIO | None = None, install_signals: bool = True) -> int:
    return await Fleet(plan, console).run(install_signals)
