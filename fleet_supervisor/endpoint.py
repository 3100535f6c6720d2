"""The supervisor's own small HTTP endpoint: ``/metrics``, ``/instances``, ``/health``, the control
channel (``/control``, hub.py) and ``POST /reload`` (admin key: a live change of the fleet file).

It lives in the supervisor, not the gateway, because the gateway never learns process state
(DESIGN §1): a FATAL instance is just an unhealthy backend to it. aiohttp is already a
dependency and runs inside the supervisor's event loop, so no thread and no second server stack.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from fleet_supervisor.hub import ControlHub
from fleet_supervisor.metrics import FleetMetrics
from fleetspec import control
from fleetspec.errors import ConfigError

Snapshot = Callable[[], list[dict[str, Any]]]
# Starts a reload and says what it will do; raises ConfigError (bad file) or RuntimeError (busy).
Reload = Callable[[], dict[str, Any]]


class Endpoint:
    def __init__(self, metrics: FleetMetrics, snapshot: Snapshot, host: str, port: int,
                 hub: ControlHub | None = None, reload: Reload | None = None,
                 admin_keys: tuple[str, ...] = ()) -> None:
        self._metrics = metrics
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

    async def _post_reload(self, request: web.Request) -> web.Response:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip().encode()
        ok = False
        for key in self._admin:  # every key, so the time taken says nothing about which was close
            ok |= hmac.compare_digest(given, key)
        if not ok:
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
