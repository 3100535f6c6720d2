"""Active health checks: GET /health on every backend, and model discovery from /v1/models.

/health is the probe because vLLM's /v1/models stays 200 while its engine hangs (DESIGN §3).
/v1/models is read only to learn names (when the config gives a bare host) and model cards,
each time a backend comes (back) into rotation, since a restarted server may serve other names.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import aiohttp

from gateway.backend import HEALTHY, UNHEALTHY, Backend
from gateway.metrics import GatewayMetrics
from gateway.poller import BackendPoller
from gateway.pool import BackendPool
from gateway.settings import GatewaySettings

log = logging.getLogger("gateway.health")


class HealthChecker(BackendPoller):
    kind = "health probe"

    def __init__(self, pool: BackendPool, settings: GatewaySettings, metrics: GatewayMetrics,
                 on_rotation: Callable[[Backend], None] | None = None) -> None:
        super().__init__(pool.backends, settings.health_interval_s, min(0.2, settings.health_interval_s),
                         settings.health_timeout_s, settings.upstream_api_key)
        self.pool = pool
        self.on_rotation = on_rotation  # told when a backend (re)enters rotation: queued requests may use it
        self.settings = settings
        self.metrics = metrics

    async def start(self) -> None:
        for b in self.pool.backends:
            self.metrics.healthy.labels(b.name).set(0)
        await super().start()

    async def poll(self, b: Backend) -> None:
        await self.probe_once(b)

    async def probe_once(self, b: Backend) -> None:
        ok, error = await self._probe(b)
        self.metrics.probes.labels(b.name, "ok" if ok else "fail").inc()
        if b.record_probe(ok, error, self.settings.health_failures, self.settings.health_successes):
            log.log(logging.INFO if b.healthy else logging.WARNING, "backend %s (%s) is now %s%s",
                    b.name, b.url, b.state, f": {error}" if error else "")
            if b.state == HEALTHY:
                await self._discover(b)
            elif b.state == UNHEALTHY:
                self.pool.forget(b)  # it may have restarted: whatever it had cached is gone
            self.metrics.healthy.labels(b.name).set(1 if b.healthy else 0)
            if b.healthy and self.on_rotation is not None:
                self.on_rotation(b)
        elif b.healthy and not b.models:
            await self._discover(b)

    async def _probe(self, b: Backend) -> tuple[bool, str | None]:
        try:
            async with self.session.get(b.url + "/health") as r:
                await r.read()
                return (True, None) if r.status == 200 else (False, f"/health answered {r.status}")
        except TimeoutError:
            return False, f"/health timed out after {self.settings.health_timeout_s}s"
        except aiohttp.ClientError as e:
            return False, f"/health failed: {e.__class__.__name__}: {e}"

    async def _discover(self, b: Backend) -> None:
        try:
            async with self.session.get(b.url + "/v1/models") as r:
                body: Any = await r.json(content_type=None) if r.status == 200 else None
        except (TimeoutError, aiohttp.ClientError, ValueError) as e:
            log.warning("could not list models of %s: %s", b.name, e)
            return
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            return
        cards = {c["id"]: c for c in data if isinstance(c, dict) and isinstance(c.get("id"), str)}
        b.cards = cards
        # Configured names are the contract; only a bare host takes its names from upstream.
        names = b.configured_models or list(cards)
        if names != b.models:
            b.models = names
            self.pool.reindex()
            log.info("backend %s serves %s", b.name, ", ".join(names))
