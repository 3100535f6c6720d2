"""The supervisor's own small HTTP endpoint: ``/metrics``, ``/instances``, ``/health``, the control
channel (``/control``, hub.py), ``POST /reload`` (admin key: a live change of the fleet file), and
for the gateway's web console ``/logs`` (recent lines, logbook.py) and ``/gpus`` (NVML memory),
which need the control token or an admin key: log lines can carry what clients sent.

It lives in the supervisor, not the gateway, because the gateway never learns process state
(DESIGN §1): a FATAL instance is just an unhealthy backend to it. aiohttp is already a
dependency and runs inside the supervisor's event loop, so no thread and no second server stack.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from fleet_supervisor.hub import ControlHub
from fleet_supervisor.logbook import LogBook
from fleet_supervisor.metrics import FleetMetrics
from fleetspec import control
from fleetspec.errors import ConfigError
from fleetspec.gpus import discover_gpus
from fleetspec.tiers import tier_for_mib

Snapshot = Callable[[], list[dict[str, Any]]]
# Starts a reload and says what it will do; raises ConfigError (bad file) or RuntimeError (busy).
Reload = Callable[[], dict[str, Any]]
_GPU_CACHE_S = 1.0  # NVML is asked at most this often, however many consoles poll


class Endpoint:
    def __init__(self, metrics: FleetMetrics, snapshot: Snapshot, host: str, port: int,
                 hub: ControlHub | None = None, reload: Reload | None = None,
                 admin_keys: tuple[str, ...] = (), logbook: LogBook | None = None) -> None:
        self._metrics = metrics
        self._logbook = logbook
        self._gpus: tuple[float, list[dict[str, Any]]] = (0.0, [])
        self._hub = hub
        self._reload = reload
        self._admin = tuple(k.encode() for k in admin_keys if k)
        self._snapshot = snapshot
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    async def _get_metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=self._metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _get_instances(self, _: web.Request) -> web.Response:
        return web.json_response({"instances": self._snapshot()})

    async def _get_health(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    def _is_admin(self, request: web.Request, token_too: bool = False) -> bool:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip().encode()
        keys = (*self._admin, self._hub.token.encode()) if token_too and self._hub is not None else self._admin
        ok = False
        for key in keys:  # every key, so the time taken says nothing about which was close
            ok |= hmac.compare_digest(given, key)
        return ok

    async def _get_logs(self, request: web.Request) -> web.Response:
        if not self._is_admin(request, token_too=True):
            return web.json_response({"error": "missing or wrong admin key or control token"}, status=401)
        assert self._logbook is not None
        try:
            after = int(request.query.get("after", "0"))
            limit = max(1, min(2000, int(request.query.get("limit", "500"))))
        except ValueError:
            return web.json_response({"error": "after and limit must be integers"}, status=400)
        return web.json_response(self._logbook.since(after, request.query.get("source") or None, limit))

    async def _get_gpus(self, request: web.Request) -> web.Response:
        if not self._is_admin(request, token_too=True):
            return web.json_response({"error": "missing or wrong admin key or control token"}, status=401)
        at, gpus = self._gpus
        if time.monotonic() - at > _GPU_CACHE_S:
            # NVML (or its nvidia-smi fallback) blocks: off the loop that supervises the children.
            found = await asyncio.to_thread(discover_gpus)
            gpus = [{**dataclasses.asdict(g), "vram_tier": tier_for_mib(g.memory_total_mib).value} for g in found]
            self._gpus = (time.monotonic(), gpus)
        return web.json_response({"gpus": gpus})

    async def _post_reload(self, request: web.Request) -> web.Response:
        if not self._is_admin(request):
            return web.json_response({"ok": False, "error": "missing or wrong admin key"}, status=401)
        assert self._reload is not None
        try:
            return web.json_response({"ok": True, **self._reload()}, status=202)
        except RuntimeError as e:
            return web.json_response({"ok": False, "error": str(e)}, status=409)
        except ConfigError as e:  # the file is bad: nothing changed
            return web.json_response({"ok": False, "error": str(e)}, status=400)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._get_metrics)
        app.router.add_get("/instances", self._get_instances)
        app.router.add_get("/health", self._get_health)
        if self._hub is not None:
            app.router.add_get(control.PATH, self._hub.handle)
        if self._reload is not None:
            app.router.add_post("/reload", self._post_reload)
        if self._logbook is not None:
            app.router.add_get("/logs", self._get_logs)
        app.router.add_get("/gpus", self._get_gpus)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port, reuse_address=True).start()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"
