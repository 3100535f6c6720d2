"""The gateway's end of the control channel to the supervisor (fleetspec/control.py).

The third writer of backend state (docs/architecture.md §2): what the instance's owner says it is
doing. SLEEPING and WAKING make a backend ``asleep`` (servable: requests wait and ask for a wake),
DRAINING makes it ``draining`` (no new requests; this gateway acknowledges once nothing of its own
is in flight there), anything else hands an asleep or draining backend back to the probes. The
supervisor's list is also the fleet's membership: an instance it adds is added, one it drops is
removed (a live reload). Back the other way go demand (requests waiting for a model), activity
(in flight and last request per backend, for idle time and least-recently-used) and admin
commands. Without ``FLEET_SUPERVISOR_URL`` none of this runs and the gateway serves on its probes.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

import aiohttp

from fleetspec import control
from fleetspec.tiers import VramTier
from gateway.backend import Backend, BackendSet
from gateway.state import BackendState, Writer

log = logging.getLogger("gateway.control")

_ACTIVITY_S = 0.5  # activity is sent at most this often, and only when it changed
_DRAIN_POLL_S = 0.02
_RECONNECT_MAX_S = 2.0
_COMMAND_S = 15.0
S = BackendState


class SupervisorLink:
    def __init__(self, url: str, token: str, backends: BackendSet) -> None:
        self.url = url.rstrip("/") + control.PATH
        self._headers = {"Authorization": f"Bearer {token}"}
        self.backends = backends
        self.connected = False
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._drains: dict[Backend, asyncio.Task[None]] = {}
        self._demand: dict[str, int] = {}
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[tuple[int, str]]] = {}
        self._sent_activity: tuple[Any, ...] = ()
        self._outbox: asyncio.Queue[str] = asyncio.Queue()

    # -- what the rest of the gateway calls --------------------------------------------------------

    def queued(self, model: str, waiting: int) -> None:
        """The limiter's hook: ``waiting`` requests now wait for ``model``."""
        if self._demand.get(model) != waiting:
            self._demand[model] = waiting
            self._send(control.encode(control.DEMAND, model=model, waiting=waiting))

    async def command(self, instance: str, action: str) -> tuple[int, str]:
        """An admin command, answered by the supervisor: (status as HTTP, message)."""
        if self._ws is None:
            return 503, "the supervisor's control channel is not connected"
        n = next(self._ids)
        fut: asyncio.Future[tuple[int, str]] = asyncio.get_running_loop().create_future()
        self._pending[n] = fut
        try:
            self._send(control.encode(control.COMMAND, id=n, instance=instance, action=action))
            return await asyncio.wait_for(fut, _COMMAND_S)
        except TimeoutError:
            return 503, f"the supervisor did not answer within {_COMMAND_S:g}s"
        finally:
            self._pending.pop(n, None)

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._connect_loop(), name="control"),
                       asyncio.create_task(self._activity_loop(), name="control-activity")]

    async def stop(self) -> None:
        for t in [*self._tasks, *self._drains.values()]:
            t.cancel()
        await asyncio.gather(*self._tasks, *self._drains.values(), return_exceptions=True)

    async def _connect_loop(self) -> None:
        pause = 0.05
        async with aiohttp.ClientSession(headers=self._headers) as session:
            while True:
                try:
                    async with session.ws_connect(self.url, heartbeat=10.0) as ws:
                        self._ws, self.connected, pause = ws, True, 0.05
                        log.info("control channel to the supervisor connected")
                        self._outbox = asyncio.Queue()  # what was queued for a closed socket is stale
                        writer = asyncio.create_task(self._write(ws), name="control-writer")
                        try:
                            self._resend_state()
                            async for msg in ws:
                                if msg.type == aiohttp.WSMsgType.TEXT:
                                    self._receive(msg.data)
                        finally:
                            writer.cancel()
                except (aiohttp.ClientError, OSError, TimeoutError) as e:
                    log.debug("control channel: %s", e)
                if self.connected:
                    log.warning("control channel to the supervisor lost; reconnecting")
                self._ws, self.connected = None, False
                for fut in self._pending.values():
                    if not fut.done():
                        fut.set_result((503, "the control channel closed"))
                await asyncio.sleep(pause)
                pause = min(_RECONNECT_MAX_S, pause * 2)

    def _resend_state(self) -> None:
        """A new connection (or a restarted supervisor) starts with what this gateway knows."""
        self._sent_activity = ()
        for model, waiting in self._demand.items():
            if waiting:
                self._send(control.encode(control.DEMAND, model=model, waiting=waiting))

    def _send(self, text: str) -> None:
        if self._ws is not None:
            self._outbox.put_nowait(text)

    async def _write(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """The one writer of a connection, so messages leave in the order they were made."""
        while True:
            text = await self._outbox.get()
            try:
                await ws.send_str(text)
            except (ConnectionError, RuntimeError):
                return  # closing: the reader sees it and reconnects

    # -- incoming ---------------------------------------------------------------------------------

    def _receive(self, text: str) -> None:
        try:
            doc = control.parse(text)
        except ValueError as e:
            log.warning("ignored a control message: %s", e)
            return
        if doc["type"] == control.INSTANCES:
            self._apply(doc["instances"])
        elif doc["type"] == control.RESULT:
            fut = self._pending.get(doc["id"])
            if fut is not None and not fut.done():
                fut.set_result((doc["status"], doc["message"]))

    def _apply(self, instances: list[dict[str, Any]]) -> None:
        named = {i["name"]: i for i in instances}
        for b in list(self.backends):
            if b.name not in named:
                log.info("backend %s left the fleet", b.name)
                self.backends.remove(b)
        for name, inst in named.items():
            known = self.backends.get(name)
            if known is not None and known.url != inst["url"].rstrip("/"):
                log.info("backend %s moved to %s", name, inst["url"])
                self.backends.remove(known)  # a new address is a new backend: probed afresh
                known = None
            if known is not None and known.configured_models != inst["models"]:
                known.configured_models = list(inst["models"])
                self.backends.set_models(known, list(inst["models"]))
            if known is None:
                known = Backend(name, inst["url"].rstrip("/"), VramTier.UNKNOWN, list(inst["models"]),
                                list(inst["models"]))
                self.backends.add(known)
                log.info("backend %s joined the fleet at %s serving %s", name, known.url, ", ".join(known.models))
            self._follow(known, inst)

    def _follow(self, b: Backend, inst: dict[str, Any]) -> None:
        state, epoch = inst["state"], inst["epoch"]
        before = b.supervisor_state
        b.supervisor_state, b.epoch, b.wakes = state, epoch, inst["wakes"]
        if state == control.DRAINING:
            if b.state is not S.DRAINING:
                b.move(Writer.SUPERVISOR, S.DRAINING)
            if b not in self._drains:
                self._drains[b] = asyncio.create_task(self._ack_when_idle(b), name=f"drain:{b.name}")
            return
        if state in (control.SLEEPING, control.WAKING):
            if b.state is not S.ASLEEP:
                b.move(Writer.SUPERVISOR, S.ASLEEP)
        elif b.state in (S.ASLEEP, S.DRAINING) or (state == control.RUNNING and before != control.RUNNING
                                                     and b.state in (S.UNHEALTHY, S.EJECTED)):
            # The probes take over, and health.py probes it at once: a backend the supervisor has
            # just (re)started, woken or handed back need not wait for the next interval.
            b.move(Writer.SUPERVISOR, S.UNKNOWN)

    async def _ack_when_idle(self, b: Backend) -> None:
        # In-flight counts move on the hot path, which must not pay for this rare wait: poll.
        acked = -1
        try:
            while b.state is S.DRAINING:
                if b.in_flight == 0 and acked != b.epoch:
                    acked = b.epoch
                    self._send(control.encode(control.DRAINED, instance=b.name, epoch=acked))
                await asyncio.sleep(_DRAIN_POLL_S)
        finally:
            self._drains.pop(b, None)

    # -- activity ---------------------------------------------------------------------------------

    async def _activity_loop(self) -> None:
        while True:
            await asyncio.sleep(_ACTIVITY_S)
            in_flight = {b.name: b.in_flight for b in self.backends}
            last = {b.name: b.last_request for b in self.backends if b.last_request}
            # With the epoch the backend is healthy in: a restart that went out of rotation and back
            # between two sends still changes what is sent, and the supervisor can tell this
            # "in rotation" from one reported before the restart.
            healthy = {b.name: b.epoch for b in self.backends if b.healthy}
            key = (tuple(in_flight.items()), tuple(last.items()), tuple(sorted(healthy.items())))
            if key != self._sent_activity and self._ws is not None:
                self._sent_activity = key
                self._send(control.encode(control.ACTIVITY, in_flight=in_flight, last_request=last,
                                          in_rotation=healthy))
