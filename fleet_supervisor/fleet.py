"""The whole fleet in one event loop: every instance, the gateway, the endpoint, progress lines.

As in uvicorn's supervisors, signal handlers only set an event and one loop does the work: the
first SIGINT/SIGTERM asks for a stop, a second one cuts the grace periods short. Shutdown stops
the gateway first, so requests in flight can finish against backends that are still up, then
every instance in parallel, and returns only when every process group is empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import signal
import sys
from typing import Any, TextIO, cast
from urllib.parse import urlsplit

import aiohttp

from fleet_supervisor.command import LaunchSpec, gateway_address
from fleet_supervisor.endpoint import Endpoint
from fleet_supervisor.gateway_child import gateway_spec, gateway_supervision
from fleet_supervisor.hub import ControlHub
from fleet_supervisor.instance import InstanceSupervisor
from fleet_supervisor.logbook import LogBook
from fleet_supervisor.metrics import FleetMetrics
from fleet_supervisor.plan import Plan, make_plan, write_infernet
from fleet_supervisor.process import become_subreaper
from fleet_supervisor.progress import Progress
from fleet_supervisor.reload import Diff, Reloader, diff
from fleet_supervisor.runfile import Launched, Recorder, state_path
from fleet_supervisor.state import State
from fleet_supervisor.swap import Swapper
from fleetspec.errors import ConfigError
from fleetspec.fleetfile import Instance, load_fleet
from fleetspec.gpus import discover_gpus


class Fleet:
    def __init__(self, plan: Plan, console: TextIO | None = None) -> None:
        self.plan = plan
        # Every line said here or by a child passes through the log book: the console's /logs.
        self.logbook = LogBook(console if console is not None else sys.stdout)
        self.console = cast(TextIO, self.logbook)
        self.stop = asyncio.Event()
        self.instances: list[InstanceSupervisor] = []
        self.gateway: InstanceSupervisor | None = None
        self.metrics = FleetMetrics([s.name for s in plan.instances] + [plan.gateway.name])
        self.endpoint: Endpoint | None = None
        self.progress = Progress(self.children, self._say)
        sup = plan.fleet.supervisor
        # The control channel (docs/architecture.md §3) lives on the supervisor's endpoint; its token
        # is new for every run and reaches only the gateway child, through its environment.
        self.hub = ControlHub(secrets.token_urlsafe(24), self.instance_states) if sup.metrics_port else None
        self.swapper: Swapper | None = None
        self.reloader = Reloader(self)
        self._session: aiohttp.ClientSession | None = None
        self._stops: dict[str, asyncio.Event] = {}  # per instance: a retirement stops one alone
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._reloads: set[asyncio.Task[None]] = set()

    def _say(self, message: str) -> None:
        self.console.write(f"[fleet] {message}\n")
        self.console.flush()

    say = _say

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
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGHUP, self._sighup)
            installed.append(signal.SIGHUP)
        return installed

    def _sighup(self) -> None:
        """SIGHUP: reload the fleet file `up` was started with; a bad file changes nothing."""
        try:
            d = self.reload()
        except (ConfigError, RuntimeError) as e:
            self._say(f"reload refused, nothing changed: {e}")
            return
        self._say(f"reload accepted: {d.summary()}")

    async def run(self, install_signals: bool = True) -> int:
        plan = self.plan
        sup = plan.fleet.supervisor
        installed = self._install_signals() if install_signals else []
        become_subreaper()
        path = write_infernet(plan)
        self._say(f"wrote {path} ({len(plan.instances)} instances, node tier {plan.infernet['vram_tier']})")
        self._say(f"CPUs: {plan.placement.describe()}")
        host, port = gateway_address(plan.fleet, plan.gateway.env)
        # The state file lets the next `up` find our children if we are SIGKILLed (leftovers.py);
        # written before the first spawn, so that a second `up` of this fleet sees this one.
        recorder = Recorder(state_path(sup.state_dir), plan.source, self._launched)
        recorder.record()
        recording = asyncio.create_task(recorder.run(), name="state-file")
        try:
            async with aiohttp.ClientSession() as session:
                self._session = session
                self.instances = [
                    InstanceSupervisor(spec, sup, session, url=inst.url, metrics=self.metrics, console=self.console)
                    for spec, inst in zip(plan.instances, plan.fleet.instances, strict=True)
                ]
                self.gateway = InstanceSupervisor(gateway_spec(plan, self.hub), gateway_supervision(sup), session,
                                                  url=f"http://{host}:{port}", metrics=self.metrics,
                                                  console=self.console)
                self.swapper = Swapper(self.instances, plan.fleet.swap, self.hub, self.metrics)
                for child in self.children():
                    child.on_transition = self._observer(child)
                for inst in self.instances:
                    inst.hub = self.hub
                    inst.swapper = self.swapper if self.swapper.manages(inst) else None
                if self.hub is not None:
                    self.hub.on_report = self.swapper.decide
                    self.hub.on_command = self.command
                await self._start_endpoint()
                await self._supervise()
        finally:
            recording.cancel()
            if self.hub is not None:
                await self.hub.close()
            if self.endpoint is not None:
                await self.endpoint.close()
            loop = asyncio.get_running_loop()
            for sig in installed:
                loop.remove_signal_handler(sig)
        recorder.remove()
        self._say("stopped; no process left")
        return 0

    def _launched(self) -> list[Launched]:
        return [Launched(c.name, c.pid, urlsplit(c.url).port if c.url else None, c.spec.argv)
                for c in self.children() if c.pid is not None]

    async def _start_endpoint(self) -> None:
        sup = self.plan.fleet.supervisor
        if not sup.metrics_port:
            return
        keys = tuple((self.gateway.spec.env.get("FLEET_ADMIN_KEYS") or "").split(",")) if self.gateway else ()
        endpoint = Endpoint(self.metrics, self.snapshot, sup.metrics_host, sup.metrics_port, self.hub,
                            lambda: self.reload().describe(), tuple(k.strip() for k in keys), self.logbook)
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
        gw_stop = asyncio.Event()
        for c in self.instances:
            self._launch(c)
        gw_task = asyncio.create_task(gateway.run(gw_stop), name="gateway")
        progress = asyncio.create_task(self.progress.run(self.plan.fleet.supervisor.progress_interval_s),
                                       name="progress")
        swapping = asyncio.create_task(self.swapper.run(), name="swap") if self.swapper else None
        try:
            await self.stop.wait()
        finally:
            self._say("stopping: gateway first, then every instance")
            progress.cancel()
            if swapping is not None:
                swapping.cancel()
            for task in self._reloads:
                task.cancel()
            gw_stop.set()
            await asyncio.gather(gw_task, return_exceptions=True)
            for ev in self._stops.values():
                ev.set()
            for res in await asyncio.gather(*self._tasks.values(), return_exceptions=True):
                if isinstance(res, BaseException) and not isinstance(res, asyncio.CancelledError):
                    self._say(f"an instance loop failed: {res!r}")

    # -- membership (start-up and live reloads) ---------------------------------------------------

    def _launch(self, inst: InstanceSupervisor) -> None:
        stop = self._stops[inst.name] = asyncio.Event()
        self._tasks[inst.name] = asyncio.create_task(inst.run(stop), name=f"instance-{inst.name}")

    def find(self, name: str) -> InstanceSupervisor | None:
        return next((i for i in self.instances if i.name == name), None)

    def add_instance(self, spec: LaunchSpec, cfg: Instance) -> InstanceSupervisor:
        assert self._session is not None
        inst = InstanceSupervisor(spec, self.plan.fleet.supervisor, self._session, url=cfg.url,
                                  metrics=self.metrics, console=self.console)
        inst.on_transition = self._observer(inst)
        inst.hub = self.hub
        if self.swapper is not None:
            self.swapper.add(inst)
            inst.swapper = self.swapper if self.swapper.manages(inst) else None
        self.metrics.track(inst.name)
        self.instances.append(inst)
        self._launch(inst)
        if self.hub is not None:
            self.hub.broadcast()
        return inst

    async def retire(self, name: str) -> None:
        """Drain (if serving), stop, and drop the instance; the gateways drop it with it."""
        inst = self.find(name)
        if inst is None:
            return
        inst.request_retire()
        if inst.state is not State.RUNNING:  # nothing to drain: stop it now
            self._stops[name].set()
        await asyncio.gather(self._tasks[name], return_exceptions=True)
        self.instances.remove(inst)
        del self._tasks[name], self._stops[name]
        if self.swapper is not None:
            self.swapper.remove(inst)
        if self.hub is not None:
            self.hub.broadcast()

    async def replace(self, spec: LaunchSpec, cfg: Instance) -> bool:
        """Restart an instance with a new spec: in place (drained first) when it runs, else by a
        new loop. True when in place."""
        inst = self.find(spec.name)
        if inst is not None and inst.state is State.RUNNING:
            inst.reconfigure(spec, cfg.url)
            inst.request_restart()
            if self.hub is not None:
                self.hub.broadcast()  # new models or port reach the gateways now
            return True
        await self.retire(spec.name)
        self.add_instance(spec, cfg)
        return False

    def adopt_plan(self, plan: Plan) -> None:
        self.plan = plan
        write_infernet(plan)
        if self.swapper is not None:
            self.swapper.configure(plan.fleet.swap)

    def reload(self) -> Diff:
        """Check the fleet file again and start applying the difference; ConfigError changes nothing."""
        if self.reloader.busy:
            raise RuntimeError("a reload is still being applied; try again when it is done")
        fleet = load_fleet(self.plan.source)
        held = frozenset(p for p in [*(i.port for i in self.plan.fleet.instances), self.plan.fleet.gateway.port,
                                     self.plan.fleet.supervisor.metrics_port] if p)
        new = make_plan(fleet, discover_gpus(), self.plan.source, held=held, placement=self.plan.placement)
        d = diff(self.plan, new)
        task = asyncio.create_task(self.reloader.apply(new, d), name="reload")
        self._reloads.add(task)
        task.add_done_callback(self._reloads.discard)
        return d

    def instance_states(self) -> list[dict[str, Any]]:
        """What the control channel tells the gateways (fleetspec/control.py)."""
        return [{"name": i.name, "state": i.state.value, "epoch": i.epoch, "url": i.url or "", "models": i.models,
                 "wakes": i.state is State.DRAINING and i.target == "asleep" and not i.restart_wanted}
                for i in self.instances]

    async def command(self, name: str, action: str) -> str:
        """An admin command from a gateway (control channel): ask the instance's loop."""
        inst = self.find(name)
        if inst is None:
            raise LookupError(f"no instance named '{name}' (instances: {', '.join(i.name for i in self.instances)})")
        if action == "restart":
            inst.request_restart()
            return f"{name}: restart asked (it drains first)"
        if action == "sleep":
            inst.request_sleep("admin")  # ValueError without a sleep: block
            if self.swapper is not None:
                self.swapper.asked(inst, "admin")
            return f"{name}: sleep asked (it drains first)"
        inst.request_wake("admin")
        return f"{name}: wake asked"

    def _observer(self, child: InstanceSupervisor) -> Any:
        def observe(old: State, new: State) -> None:
            if child is not self.gateway:
                if self.swapper is not None:
                    self.swapper.transition(child, old, new)
                if self.hub is not None:
                    self.hub.broadcast()
            self.progress.transition(new, len(self.instances), self.gateway.url if self.gateway else None)
        return observe


async def run_fleet(plan: Plan, console: TextIO | None = None, install_signals: bool = True) -> int:
    return await Fleet(plan, console).run(install_signals)
