"""The supervisor's own small HTTP endpoint: ``/metrics``, ``/instances`` and ``/health``.

It lives in the supervisor, not the gateway, because the gateway never learns process state
(DESIGN §1): a FATAL instance is just an unhealthy backend to it. aiohttp is already a
dependency and runs inside the supervisor's event loop, so no thread and no second server stack.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from fleet_supervisor.metrics import FleetMetrics

Snapshot = Callable[[], list[dict[str, Any]]]


class Endpoint:
    def __init__(self, metrics: FleetMetrics, snapshot: Snapshot, host: str, port: int) -> None:
        self._metrics = metrics
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

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._get_metrics)
        app.router.add_get("/instances", self._get_instances)
        app.router.add_get("/health", self._get_health)
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
