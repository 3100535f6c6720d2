"""Per-request timestamps inside a gateway process, for placing issue 21's TTFT gap (bench only,
installed by ``gateway_variant.py --trace``; the product never loads it).

For every POST it keeps, on ``time.perf_counter()`` (CLOCK_MONOTONIC on Linux, the clock
``vllm bench serve`` stamps its requests with, so the two line up on one host):

- ``conn``: the connection was accepted (``connection_made``), for a connection's first request;
- ``read``: the event loop read the request's first bytes (httptools' ``on_message_begin``);
- ``app``: the ASGI app was called (uvicorn's task for the request started);
- ``head``: the app sent ``http.response.start``;
- ``sent``: the request went to the upstream pool (a connection taken or opened, then written);
  ``connect`` where a new upstream connection was opened for it (its start) and ``connected``
  (the gateway's loop saw it established), ``upstream_head`` when vLLM's response head was in;
- ``first``: the app sent the first non-empty body chunk;
- ``end``: the app returned;

keyed by the request's ``x-request-id`` (``vllm bench serve`` sends one per request).
``GET /_trace`` answers the records kept so far and forgets them.
"""

from __future__ import annotations

import contextvars
import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import gateway.app as app_module
import gateway.coalesce as coalesce
import gateway.upstream as upstream

RECORDS: list[dict[str, Any]] = []
_CURRENT: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("trace", default=None)


def _vllm_trace() -> Any:
    """vllm_trace/sitecustomize.py, loaded under a name of its own (a process may have a real
    sitecustomize already)."""
    path = Path(__file__).resolve().parent / "vllm_trace" / "sitecustomize.py"
    spec = importlib.util.spec_from_file_location("fleet_vllm_trace", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def install() -> None:
    proto = coalesce.HttpToolsProtocol
    _vllm_trace().stamp_reads(proto)
    headers_done = proto.on_headers_complete

    def on_headers_complete(self: Any) -> None:
        headers_done(self)  # builds self.scope; the request's task runs later, after this returns
        self.scope["trace"] = {"conn": getattr(self, "_trace_conn", None), "read": self._trace_read}
        self._trace_conn = None  # only a connection's first request waited for the accept

    proto.on_headers_complete = on_headers_complete  # type: ignore[method-assign]

    pool = upstream.UpstreamPool
    send_, connect_ = pool.send, pool._connect

    async def send(self: Any, origin: Any, request: Any, head_deadline: float) -> Any:
        rec = _CURRENT.get()
        if rec is not None:
            rec.setdefault("sent", time.perf_counter())  # the first try, not a retry's
        conn = await send_(self, origin, request, head_deadline)
        if rec is not None:
            rec.setdefault("upstream_head", time.perf_counter())
        return conn

    async def connect(self: Any, origin: Any) -> Any:
        rec = _CURRENT.get()
        if rec is not None:
            rec.setdefault("connect", time.perf_counter())
        conn = await connect_(self, origin)
        if rec is not None:
            rec.setdefault("connected", time.perf_counter())  # the gateway's loop saw it established
        return conn

    pool.send = send  # type: ignore[method-assign]
    pool._connect = connect  # type: ignore[method-assign]

    call = app_module.FleetGateway.__call__

    async def traced(self: Any, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await call(self, scope, receive, send)
            return
        if scope["method"] == "GET" and scope["path"] == "/_trace":
            body = json.dumps(RECORDS).encode()
            RECORDS.clear()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
            return
        rec: dict[str, Any] = dict(scope.get("trace") or {})
        rec["app"] = time.perf_counter()
        rec["id"] = next((v.decode() for k, v in scope["headers"] if k == b"x-request-id"), None)

        async def stamping(message: Any) -> None:
            if message["type"] == "http.response.start":
                rec["head"] = time.perf_counter()
                rec["status"] = message["status"]
            elif "first" not in rec and message.get("body"):
                rec["first"] = time.perf_counter()
            await send(message)

        _CURRENT.set(rec)
        try:
            await call(self, scope, receive, stamping)
        finally:
            rec["end"] = time.perf_counter()
            if scope["method"] == "POST":
                RECORDS.append(rec)

    app_module.FleetGateway.__call__ = traced  # type: ignore[method-assign]
