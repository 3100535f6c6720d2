"""The gateway application: a FastAPI app for the control surface, with POST /v1/* taken by the
raw ASGI proxy before FastAPI's routing and middleware stack (cheaper per request and per event;
bench/ measures it). The OpenAPI schema still documents the proxied paths."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope, Send

from fleetspec.infernet import BackendSpec
from fleetspec.tiers import VramTier
from gateway import errors
from gateway.auth import ADMIN_PREFIX, KeyCheck
from gateway.backend import Backend, BackendSet
from gateway.console import Console
from gateway.control import SupervisorLink
from gateway.ejection import Ejector
from gateway.health import HealthChecker
from gateway.inbound import ROOT_ROUTED
from gateway.limiter import Limiter
from gateway.load import STALE_INTERVALS
from gateway.loadscrape import LoadScraper
from gateway.metrics import GatewayMetrics
from gateway.pool import BackendPool
from gateway.prefixshare import PrefixTable
from gateway.proxy import Proxy
from gateway.routing import Router
from gateway.settings import GatewaySettings
from gateway.shared import SharedCounts, turn_counter
from gateway.warm import Warmer

PROXIED = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
# The cyclic GC's first-generation threshold while serving (CPython's default: 700). The count it
# is compared with is allocations minus deallocations of tracked objects, so with the startup heap
# frozen it is mostly the state of the requests in flight: at 700, 64 concurrent requests set off
# a collection every ~48 requests (bench/compare's conc phase, gc.callbacks in the gateway: 414 in
# 20,000 requests, 3.4-4.6 µs per request) and every one found nothing to free, since the request
# path leaves no reference cycles (tests/gateway/test_gc.py). At 10,000 the same load ran none,
# and under 256 paced streams the collector's time fell from 34 to 8 µs per stream with no longer
# pauses (bench/compare/gc_pauses.py); cycles made elsewhere (error paths) are still collected.
YOUNG_GC_THRESHOLD = 10_000


def _envelope(status: int, message: str, type_: str, code: str | int | None,
              headers: dict[str, str] | None = None) -> Response:
    return Response(errors.error_body(message, type_, code), status, headers, media_type="application/json")


class FleetGateway:
    """The ASGI callable uvicorn serves."""

    def __init__(self, settings: GatewaySettings, backends: list[BackendSpec], node_tier: VramTier | None,
                 shared: SharedCounts | None = None, prefixes: PrefixTable | None = None) -> None:
        self.settings = settings
        self.prefixes = prefixes  # the workers' shared prefix index (prefixshare.py); None: each router its own
        self.shared = shared
        self.metrics = GatewayMetrics()
        # The composition root: the backend set first, then its subscribers (docs/architecture.md §2).
        self.backends = BackendSet(Backend.from_spec(s) for s in backends)
        self.metrics.watch(self.backends)
        self.pool = BackendPool(self.backends, node_tier, self._router_for, self.metrics.decision, shared)
        self.scraper = LoadScraper(self.backends, settings.load_scrape_interval_s, settings.health_timeout_s,
                                   settings.upstream_api_key, self.pool.count,
                                   self.metrics.set_load_stalled) if settings.scrapes_load else None
        self.limiter = Limiter(self.pool, settings, self.metrics)
        self.health = HealthChecker(self.backends, settings, self._probed, shared)
        self.ejector = Ejector(self.backends, settings, self.metrics, shared)
        self.proxy = Proxy(self.pool, settings, self.metrics, self.limiter, self.ejector)
        self.warmer = Warmer(self.backends, self.limiter, self.proxy.upstream, settings.health_interval_s,
                             settings.workers) if settings.upstream_warm else None
        self.link: SupervisorLink | None = None
        if settings.supervisor_url and settings.control_token:
            self.link = SupervisorLink(settings.supervisor_url, settings.control_token, self.backends)
            self.limiter.on_queue = self.link.queued
        self.auth = KeyCheck(settings.keys(), settings.public_models, settings.protect_metrics, settings.admin(),
                             console=settings.console)
        self.console = Console(settings, self.backends, self.pool, self.metrics.activity, self.auth,
                               self.link, self.pool.count) if settings.console else None
        self.api = self._build_api()

    def _probed(self, name: str, ok: bool) -> None:
        """A probe's count, and this worker's connections to that backend as of it
        (``fleet_upstream_connections``: how many an instance holds from the gateway)."""
        self.metrics.count_probe(name, ok)
        if (b := self.backends.get(name)) is not None:
            self.metrics.upstream_connections(name, self.proxy.upstream.counts(b.url))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if not self.auth.allows(scope):
                if scope["path"].startswith(ADMIN_PREFIX) and not self.auth.admin_keys:
                    await errors.send_error(send, 403, "admin endpoints are off: set FLEET_ADMIN_KEYS (`vllm-fleet up` "
                                            "makes one in .fleet/admin.key)", errors.INVALID_REQUEST, "admin_disabled")
                    return
                await errors.send_error(send, 401, "missing or invalid API key (send Authorization: Bearer <key>)",
                                        errors.INVALID_REQUEST, "invalid_api_key",
                                        headers=[(b"www-authenticate", b"Bearer")])
                return
            if scope["method"] == "POST" and (scope["path"].startswith("/v1/") or scope["path"] in ROOT_ROUTED):
                await self.proxy(scope, receive, send)
                return
        await self.api(scope, receive, send)

    def _ready(self, model: str | None) -> Response | dict[str, Any]:
        """Readiness that scripts and orchestrators can trust: every served model (or ``model``) has
        a replica that takes requests now or wakes for them (docs/http.md)."""
        pool = self.pool
        if model is not None:
            if not pool.knows(model):
                served = ", ".join(pool.served_models()) or "(none)"
                return _envelope(404, f"The model '{model}' does not exist. Served models: {served}",
                                 errors.INVALID_REQUEST, "model_not_found")
            waiting = [model] if model in pool.unready_models() else []
        else:
            waiting = pool.unready_models()
            if pool.discovering:
                waiting.append("(models of backends still being discovered)")
            elif not pool.served_models():
                waiting.append("(no model is served)")
        if not waiting:
            return {"status": "ready", "models": [model] if model else pool.served_models()}
        return _envelope(503, "not ready: no servable replica of " + ", ".join(waiting), errors.UNAVAILABLE,
                         "no_healthy_backend", {"Retry-After": self.settings.retry_after})

    async def _admin(self, name: str, action: str) -> Response | dict[str, Any]:
        if action not in ("sleep", "wake", "restart"):
            return _envelope(404, f"no admin action '{action}' (sleep, wake, restart)", errors.INVALID_REQUEST,
                             "not_found")
        if self.link is None:
            return _envelope(503, "no supervisor: this gateway was not started by `vllm-fleet up`", errors.UNAVAILABLE,
                             "no_supervisor")
        status, message = await self.link.command(name, action)
        if status != 200:
            return _envelope(status, message, errors.INVALID_REQUEST if status < 500 else errors.UNAVAILABLE,
                             "admin_refused")
        return {"ok": True, "message": message}

    def _router_for(self, model: str) -> Router:
        s = self.settings
        return Router(s.policy_of(model), s.affinity_load_factor, s.prefix_index_blocks,
                      s.load_scrape_interval_s * STALE_INTERVALS,
                      self.prefixes.index(model) if self.prefixes is not None else None,
                      turn_counter(self.shared, model))

    def _build_api(self) -> FastAPI:
        @asynccontextmanager
        async def lifespan(_: FastAPI) -> AsyncIterator[None]:
            await self.health.start()
            self.ejector.start()
            if self.scraper is not None:
                await self.scraper.start()
            if self.link is not None:
                await self.link.start()
            if self.warmer is not None:
                self.warmer.start()
            # Everything imported and built so far lives as long as the process. Frozen, the
            # cyclic GC stops walking it: a full collection took 22-38 ms here (FastAPI,
            # pydantic, prometheus), a stall for every request in flight (bench/compare p99).
            gc.freeze()
            thresholds = gc.get_threshold()
            gc.set_threshold(YOUNG_GC_THRESHOLD, *thresholds[1:])
            try:
                yield
            finally:
                gc.set_threshold(*thresholds)
                if self.console is not None:
                    await self.console.stop()
                if self.link is not None:
                    await self.link.stop()
                if self.scraper is not None:
                    await self.scraper.stop()
                await self.health.stop()
                await self.ejector.stop()
                if self.warmer is not None:
                    await self.warmer.stop()
                await self.proxy.stop()
                if self.prefixes is not None:
                    self.prefixes.close()  # its entries stay in the file for the other workers
                if self.limiter.shared is not None:
                    self.limiter.shared.close()  # this worker's counts leave the others' sums

        api = FastAPI(title="vllm-fleet gateway", version="0.1.0", lifespan=lifespan)
        pool = self.pool
        upstream = self.proxy.upstream

        @api.get("/health", summary="200 while the gateway process is up")
        async def health() -> dict[str, str]:
            return {"status": "ok"}

        @api.get("/ready", response_model=None,
                 summary="200 when every served model (or the one named by ?model=) has a servable replica")
        async def ready(model: str | None = None) -> Response | dict[str, Any]:
            return self._ready(model)

        @api.get("/v1/models", summary="Union of the models served by healthy backends")
        async def models() -> dict[str, Any]:
            return pool.models_list()

        @api.get("/fleet", summary="Node VRAM tier and the state of every backend")
        async def fleet() -> dict[str, Any]:
            return {"vram_tier": pool.node_tier().value, "ready": pool.ready(),
                    "models": pool.served_models(),
                    "backends": [{**pool.describe(b),
                                  "connections": {**upstream.counts(b.url), "per_api_server": upstream.split(b.url)}}
                                 for b in self.backends],
                    "routing": pool.routing(),
                    "supervisor": None if self.link is None else {"connected": self.link.connected}}

        @api.post("/admin/instances/{name}/{action}", response_model=None,
                  summary="Sleep, wake or restart an instance (admin key; needs `vllm-fleet up`'s supervisor)")
        async def admin(name: str, action: str) -> Response | dict[str, Any]:
            return await self._admin(name, action)

        if self.console is not None:
            self.console.mount(api)

        @api.get("/metrics", summary="Prometheus metrics")
        async def metrics() -> Response:
            return Response(self.metrics.render(), media_type=CONTENT_TYPE_LATEST)

        summary = "Routed by `model` to a healthy replica; SSE relayed chunk by chunk"
        for path in (*PROXIED, *sorted(ROOT_ROUTED)):
            api.add_api_route(path, _documented_only, methods=["POST"], summary=summary)
        api.add_api_route("/v1/{path:path}", _documented_any, methods=["POST"],
                          summary="Any other POST /v1/* that carries `model`: " + summary)

        @api.exception_handler(HTTPException)
        async def http_error(_: Request, exc: HTTPException) -> Response:
            return _envelope(exc.status_code, str(exc.detail), errors.INVALID_REQUEST, exc.status_code)

        @api.exception_handler(RequestValidationError)
        async def validation_error(_: Request, exc: RequestValidationError) -> Response:
            return _envelope(400, str(exc.errors()), errors.INVALID_REQUEST, "invalid_request")

        @api.exception_handler(Exception)
        async def unexpected(_: Request, exc: Exception) -> Response:
            # Logged with its traceback by the server; the client gets the envelope, never a trace.
            return _envelope(500, "internal gateway error", errors.INTERNAL, "internal_error")

        return api


async def _documented_only() -> JSONResponse:  # pragma: no cover - FleetGateway answers first
    """The proxy serves these before FastAPI sees them; the route exists for the OpenAPI schema."""
    return JSONResponse({}, 500)


async def _documented_any(path: str) -> JSONResponse:  # pragma: no cover - FleetGateway answers first
    """As ``_documented_only``, for the catch-all, whose path parameter the schema must declare."""
    return JSONResponse({"path": path}, 500)
