"""The supervisor's end of the control channel (fleetspec/control.py, docs/architecture.md §3).

One WebSocket per gateway worker. The hub sends every connection the instances' states (on
connect and after each change) and keeps what each connection reports: requests waiting for a
model (demand), requests in flight and the last request per instance (activity), and which drain
epochs it has acknowledged. It makes no decision: the swap policy (swap.py) reads it and the
instance loops wait on ``wait_drained``; admin commands go to ``on_command``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

from fleetspec import control

log = logging.getLogger("fleet.hub")

Snapshot = Callable[[], list[dict[str, Any]]]
# (instance, action) -> message; raises LookupError (no such instance) or ValueError (refused)
CommandHandler = Callable[[str, str], Awaitable[str]]


@dataclass
class _Peer:
    ws: web.WebSocketResponse
    demand: dict[str, int] = field(default_factory=dict)
    in_flight: dict[str, int] = field(default_factory=dict)
    last_request: dict[str, float] = field(default_factory=dict)
    in_rotation: dict[str, int] = field(default_factory=dict)  # instance -> the epoch it is routed in
    acked: dict[str, int] = field(default_factory=dict)  # instance -> highest drained epoch


class ControlHub:
    def __init__(self, token: str, snapshot: Snapshot) -> None:
        self.token = token
        self._token = token.encode()
        self._snapshot = snapshot
        self._peers: dict[web.WebSocketResponse, _Peer] = {}
        self._changed = asyncio.Condition()
        self.on_report: Callable[[], None] | None = None  # demand or activity changed (the swap policy)
        self.on_command: CommandHandler | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # -- reads (the swap policy, the instance loops) ----------------------------------------------

    @property
    def connected(self) -> int:
        return len(self._peers)

    def demand(self, model: str) -> int:
        return sum(p.demand.get(model, 0) for p in self._peers.values())

    def wanted_models(self) -> list[str]:
        return sorted({m for p in self._peers.values() for m, n in p.demand.items() if n > 0})

    def in_flight(self, instance: str) -> int:
        return sum(p.in_flight.get(instance, 0) for p in self._peers.values())

    def last_request(self, instance: str) -> float:
        return max((p.last_request.get(instance, 0.0) for p in self._peers.values()), default=0.0)

    def in_rotation(self, instance: str, epoch: int = 0) -> bool:
        """Every connected gateway routes to ``instance`` in ``epoch`` or later (true when none is connected)."""
        return all(p.in_rotation.get(instance, -1) >= epoch for p in self._peers.values())

    async def wait_drained(self, instance: str, epoch: int) -> None:
        """Until every connected gateway acknowledged ``epoch`` of ``instance`` (or left)."""
        async with self._changed:
            await self._changed.wait_for(
                lambda: all(p.acked.get(instance, -1) >= epoch for p in self._peers.values()))

    # -- writes -----------------------------------------------------------------------------------

    def broadcast(self) -> None:
        """Send the current states to every gateway; called after every instance transition."""
        if not self._peers:
            return
        text = control.encode(control.INSTANCES, instances=self._snapshot())
        for peer in list(self._peers.values()):
            self._spawn(self._send(peer, text))

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _send(peer: _Peer, text: str) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await peer.ws.send_str(text)

    # -- the endpoint -----------------------------------------------------------------------------

    def authorized(self, request: web.Request) -> bool:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").encode()
        return hmac.compare_digest(given, self._token)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if not self.authorized(request):
            return web.json_response({"error": "control channel: missing or wrong token"}, status=401)
        ws = web.WebSocketResponse(heartbeat=10.0)
        await ws.prepare(request)
        peer = self._peers[ws] = _Peer(ws)
        log.info("gateway connected to the control channel (%d now)", len(self._peers))
        await self._send(peer, control.encode(control.INSTANCES, instances=self._snapshot()))
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                try:
                    doc = control.parse(msg.data)
                except ValueError as e:
                    log.warning("ignored a control message: %s", e)
                    continue
                await self._receive(peer, doc)
        finally:
            del self._peers[ws]
            log.info("gateway left the control channel (%d now)", len(self._peers))
            await self._notify()
        return ws

    async def _receive(self, peer: _Peer, doc: dict[str, Any]) -> None:
        kind = doc["type"]
        if kind == control.DEMAND:
            peer.demand[doc["model"]] = max(0, doc["waiting"])
        elif kind == control.ACTIVITY:
            peer.in_flight = {str(k): int(v) for k, v in doc["in_flight"].items()}
            peer.last_request = {str(k): float(v) for k, v in doc["last_request"].items()}
            peer.in_rotation = {str(k): int(v) for k, v in doc["in_rotation"].items()}
        elif kind == control.DRAINED:
            peer.acked[doc["instance"]] = max(peer.acked.get(doc["instance"], -1), doc["epoch"])
        elif kind == control.COMMAND:
            self._spawn(self._command(peer, doc))
            return
        await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()
        if self.on_report is not None:
            self.on_report()

    async def _command(self, peer: _Peer, doc: dict[str, Any]) -> None:
        status, message = 409, "this supervisor takes no commands"
        if self.on_command is not None:
            try:
                message, status = await self.on_command(doc["instance"], doc["action"]), 200
            except LookupError as e:
                status, message = 404, str(e.args[0] if e.args else e)
            except ValueError as e:
                status, message = 409, str(e)
        await self._send(peer, control.encode(control.RESULT, id=doc["id"], ok=status == 200, status=status,
                                              message=message))

    async def close(self) -> None:
        for ws in list(self._peers):
            with contextlib.suppress(Exception):
                await ws.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
