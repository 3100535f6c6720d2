"""The web console: ``GET /ui`` (static files shipped in gateway/ui/) and the JSON it polls.

The page shell (``/ui``, ``/ui/static/*``) holds no data and is public, so a browser can load it
before the operator has typed a key; every byte of fleet data comes from ``/ui/api/*``, which the
gateway's key check guards like the rest of the API, and logs from ``/admin/logs``, which needs
the admin key (log lines can carry what clients sent). Controls are the existing
``POST /admin/instances/NAME/{sleep,wake,restart}``. Keys travel only in the Authorization
header: never in a URL, never in a cookie.

What the supervisor alone knows (process states, restarts, GPUs, log lines) is read from its
endpoint with the control token, and cached for ``_CACHE_S`` so that any number of open consoles
cost the supervisor a few requests a second at most. See docs/console.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from importlib import resources
from typing import Any

import aiohttp
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from fleetspec.infernet import BackendSpec, render_infernet
from gateway.activity import Activity
from gateway.auth import KeyCheck
from gateway.backend import Backend, BackendSet
from gateway.control import SupervisorLink
from gateway.pool import BackendPool
from gateway.settings import GatewaySettings

UI_PREFIX = "/ui"
STATIC_PREFIX = "/ui/static/"
_CACHE_S = 0.5
_SUPERVISOR_TIMEOUT_S = 2.0
_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
          ".html": "text/html; charset=utf-8", ".svg": "image/svg+xml"}
# No inline script or style, nothing from another origin, no framing. Scripts set element.style
# through the CSSOM (allowed); no markup is ever built from strings (console.js uses textContent).
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                    "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY", "Cache-Control": "no-cache"}


def _load_static() -> dict[str, tuple[bytes, str]]:
    files: dict[str, tuple[bytes, str]] = {}
    for item in resources.files("gateway.ui").iterdir():
        suffix = "." + item.name.rpartition(".")[2]
        if item.is_file() and suffix in _TYPES:
            files[item.name] = (item.read_bytes(), _TYPES[suffix])
    return files


class SupervisorReader:
    """GETs on the supervisor's endpoint with the control token; None when it cannot answer."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}
        self._session: aiohttp.ClientSession | None = None
        self._cache: dict[str, tuple[float, Any]] = {}

    async def get(self, path: str, params: dict[str, str] | None = None, cache: bool = True) -> Any:
        now = time.monotonic()
        hit = self._cache.get(path)
        if cache and hit is not None and now - hit[0] < _CACHE_S:
            return hit[1]
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self._headers,
                                                  timeout=aiohttp.ClientTimeout(total=_SUPERVISOR_TIMEOUT_S))
        try:
            async with self._session.get(self.url + path, params=params) as resp:
                body = await resp.json() if resp.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            body = None
        if cache:
            self._cache[path] = (time.monotonic(), body)
        return body

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class Console:
    """A reader of the gateway's parts (app.py builds it), never a writer of any."""

    def __init__(self, settings: GatewaySettings, backends: BackendSet, pool: BackendPool, activity: Activity,
                 auth: KeyCheck, link: SupervisorLink | None, count: Callable[[Backend], int]) -> None:
        self.settings, self.backends, self.pool, self.activity, self.auth, self.link = (
            settings, backends, pool, activity, auth, link)
        self.count = count  # requests open to a backend from the whole gateway (every worker)
        self.static = _load_static()
        s = settings
        self.reader = (SupervisorReader(s.supervisor_url, s.control_token)
                       if s.supervisor_url and s.control_token else None)

    async def stop(self) -> None:
        if self.reader is not None:
            await self.reader.close()

    def _file(self, name: str) -> Response:
        found = self.static.get(name)
        if found is None:
            return JSONResponse({"error": {"message": f"no file {name}", "type": "invalid_request_error",
                                           "param": None, "code": "not_found"}}, 404)
        return Response(found[0], media_type=found[1], headers=SECURITY_HEADERS)

    async def state(self) -> dict[str, Any]:
        pool, link = self.pool, self.link
        backends = list(self.backends)
        models = []
        for m in pool.served_models():
            reps = self.backends.replicas(m)
            models.append({"model": m, "replicas": len(reps), "healthy": sum(b.healthy for b in reps),
                           "in_flight": sum(map(self.count, reps)), "backends": [b.name for b in reps]})
        specs = [BackendSpec(b.name, b.url, list(b.models), b.vram_tier, b.max_num_seqs) for b in backends]
        instances = gpus = None
        if self.reader is not None:
            got_i, got_g = await asyncio.gather(self.reader.get("/instances"), self.reader.get("/gpus"))
            instances = got_i.get("instances") if isinstance(got_i, dict) else None
            gpus = got_g.get("gpus") if isinstance(got_g, dict) else None
        return {
            "time": time.time(), "vram_tier": pool.node_tier().value, "ready": pool.ready(),
            "backends": [pool.describe(b) for b in backends], "models": models,
            "series": self.activity.series(), "infernet": render_infernet(specs, pool.node_tier()),
            "supervisor": None if link is None else {"connected": link.connected, "instances": instances,
                                                     "gpus": gpus},
            "auth": {"keys": self.auth.enabled, "admin": bool(self.auth.admin_keys)},
        }

    async def logs(self, after: int, source: str | None) -> Response | dict[str, Any]:
        if self.reader is None:
            return {"last": 0, "sources": [], "lines": [], "note": "no supervisor: the gateway runs alone"}
        params = {"after": str(after), **({"source": source} if source else {})}
        got = await self.reader.get("/logs", params, cache=False)
        if not isinstance(got, dict):
            return JSONResponse({"error": {"message": "the supervisor did not answer", "type": "service_unavailable",
                                           "param": None, "code": "no_supervisor"}}, 503)
        return got

    def mount(self, api: FastAPI) -> None:
        @api.get(UI_PREFIX, include_in_schema=True, summary="The web console (docs/console.md)")
        async def page() -> Response:
            return self._file("index.html")

        @api.get(STATIC_PREFIX + "{name}", include_in_schema=False)
        async def static(name: str) -> Response:
            return self._file(name)

        @api.get(UI_PREFIX + "/api/state", summary="Console: instances, GPUs, models, per-model charts, Infernet JSON")
        async def state() -> dict[str, Any]:
            return await self.state()

        @api.get(UI_PREFIX + "/api/activity",
                 summary="Console: the last requests (prompt excerpts: FLEET_CONSOLE_PROMPTS and an admin key)")
        async def activity(request: Request, limit: int = 100) -> dict[str, Any]:
            prompts = self.settings.console_prompts and self.auth.is_admin(request.scope)
            return {"prompts": prompts, "requests": self.activity.requests(max(1, min(limit, 200)), prompts)}

        @api.get("/admin/logs", response_model=None,
                 summary="Console: recent log lines of every instance and the supervisor (admin key)")
        async def logs(after: int = 0, source: str | None = None) -> Response | dict[str, Any]:
            return await self.logs(after, source)
