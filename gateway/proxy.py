"""The hot path: a raw ASGI endpoint that relays POST /v1/* to a replica chosen by ``model``.

Bytes go through as they arrive: the request body as received, the response chunk by chunk through
the gateway's own HTTP/1.1 client (upstream.py, connection.py), whose parser callback hands each
chunk to the client's ``send`` in place (relay.py), with no task wake-up per chunk. The order of
events for one request:

1. read the body (capped), take ``model`` from it and check the caps (one JSON parse), enter the
   gateway-wide in-flight cap, take a slot on a replica or wait for one (limiter.py);
2. send it; while no response has started, a connect failure, a reset before any response, or
   a 503 sends it to another replica after a jittered pause (opener.py, retry.py: attempts and a
   deadline);
3. relay status, headers and body (stream.py); the first body byte fixes time to first byte;
4. if the upstream breaks after the first byte, a streamed completion continues on another replica
   where it can (stream.py, migration.py, sse.py: docs/stream-failover.md); otherwise, or when the
   total timeout strikes, an SSE stream gets an OpenAI error event and the connection is dropped
   without ``[DONE]`` so no client mistakes it for a complete answer.

Failed requests count towards passive ejection (ejection.py); any other answer resets the count.
A watcher on ``receive()`` cancels the request the moment the client goes away, in every phase
(queued, pausing between tries, waiting for headers, streaming), so that closing the upstream
connection makes vLLM abort the generation. An unexpected exception is logged with its traceback
and answered with the 500 envelope (or an error event mid-stream), never a trace.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

from starlette.types import Receive, Scope, Send

from gateway import errors
from gateway.activity import Entry, completion_tokens, prompt_excerpt, record_tokens_later
from gateway.backend import Backend
from gateway.coalesce import BODY_WRITE
from gateway.ejection import Ejector
from gateway.inbound import (
    BadRequest,
    ClientGone,
    Flight,
    RequestIds,
    header,
    model_of,
    read_body,
    routable,
    upstream_headers,
)
from gateway.limiter import Limiter, Rejected
from gateway.metrics import NO_BACKEND, UNKNOWN_MODEL, GatewayMetrics
from gateway.migration import plan_for, stream_tokens
from gateway.opener import CLIENT_CLOSED, Opener, OpenFailed, Outbound
from gateway.pool import BackendPool
from gateway.routing import Hint, hint_for
from gateway.settings import GatewaySettings
from gateway.stream import Stream, Streams
from gateway.upstream import UpstreamPool

log = logging.getLogger("gateway.proxy")

_DROP_RESPONSE_HEADERS = frozenset({
    b"connection", b"keep-alive", b"transfer-encoding", b"upgrade", b"trailer", b"date", b"server",
    b"proxy-authenticate",
})
_BUSY_RETRY_AFTER = [(b"retry-after", b"1")]


class Proxy:
    def __init__(self, pool: BackendPool, settings: GatewaySettings, metrics: GatewayMetrics,
                 limiter: Limiter, ejector: Ejector) -> None:
        self.pool = pool
        self.settings = settings
        self.metrics = metrics
        self.limiter = limiter
        self.ejector = ejector
        self.upstream = UpstreamPool(settings.connect_timeout_s)
        self.opener = Opener(pool, settings, metrics, limiter, ejector, self.upstream)
        self.streams = Streams(pool.backends, pool, settings, metrics, ejector, self.opener)
        self._drop_auth = bool(settings.keys())
        self._upstream_key = settings.upstream_api_key.encode("latin-1") if settings.upstream_api_key else None
        self._total_s = settings.total_timeout_s or math.inf
        self._ids = RequestIds()
        self._affinity_header = settings.affinity_header.lower().encode("latin-1")

    async def stop(self) -> None:
        self.upstream.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        flight = Flight()
        entry = self.metrics.activity.begin()
        try:
            await self._serve(scope, receive, send, flight, entry)
        except Exception:
            # A bug, not a client or upstream failure: log the trace, show the client only the envelope.
            log.exception("unexpected error relaying %s", scope.get("path"))
            await self._fail_internal(send, flight, UNKNOWN_MODEL)
        finally:
            self.metrics.activity.end(entry)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, flight: Flight, entry: Entry) -> None:
        t0 = time.perf_counter()
        model_label = UNKNOWN_MODEL
        s = self.settings
        try:
            if not routable(scope["path"]):
                raise BadRequest(404, f"no route for POST {scope['path']}", "not_found")
            body = await read_body(scope, receive, s.max_body_bytes)
            model, doc = model_of(body, s.max_tokens_cap, s.max_n_cap)
            if s.console_prompts:
                entry.prompt = prompt_excerpt(doc)
            if self.pool.knows(model):
                model_label = model
                hint = hint_for(doc, header(scope, self._affinity_header)) if self.pool.affine(model) else None
            elif self.pool.discovering:
                raise BadRequest(503, f"model '{model}' is not known yet: backends are still being discovered",
                                 "no_healthy_backend", "model")
            else:
                served = ", ".join(self.pool.served_models()) or "(none)"
                raise BadRequest(404, f"The model '{model}' does not exist. Served models: {served}",
                                 "model_not_found", "model")
            self.limiter.enter()
        except ClientGone:
            self.metrics.count(model_label, NO_BACKEND, CLIENT_CLOSED)
            return
        # One name per exception type: mypyc types a name by its first binding, so a second
        # ``except ... as e`` of another type fails its run-time check (bench/README.md, compiled).
        except BadRequest as bad:
            await self._reject(send, flight, bad, model_label)
            return
        except Rejected as busy:
            await self._busy(send, flight, busy, model_label)
            return
        # On CPython 3.11 asyncio.get_running_loop() and current_task() without a loop each make a
        # getpid(2) (a check against fork): the loop once here serves this request's other uses.
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        assert task is not None
        flight.watch(receive, task)
        try:
            await self._forward(scope, send, body, doc, model, hint, t0, flight, loop)
        except asyncio.CancelledError:
            if not flight.gone:
                raise  # server shutdown, not the client: let it propagate
            # cancel() has been consumed; the task goes on to finish normally.
            task.uncancel()
        except Rejected as busy:
            await self._busy(send, flight, busy, model)
        finally:
            flight.done = True
            flight.stop()
            self.limiter.leave()

    async def _error(self, send: Send, flight: Flight, status: int, message: str, type_: str, code: str,
                     param: str | None = None, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        flight.started = True
        await errors.send_error(send, status, message, type_, code, param, headers)

    def _retry_after(self) -> list[tuple[bytes, bytes]]:
        return [(b"retry-after", self.settings.retry_after.encode())]

    async def _reject(self, send: Send, flight: Flight, e: BadRequest, model_label: str) -> None:
        headers = self._retry_after() if e.status == 503 else None
        type_ = errors.UNAVAILABLE if e.status == 503 else errors.INVALID_REQUEST
        await self._error(send, flight, e.status, str(e), type_, e.code, e.param, headers)
        self.metrics.count(model_label, NO_BACKEND, e.status)

    async def _busy(self, send: Send, flight: Flight, e: Rejected, model_label: str) -> None:
        self.metrics.rejected.labels(e.reason).inc()
        await self._error(send, flight, 429, str(e), errors.RATE_LIMIT, "rate_limit_exceeded",
                          headers=_BUSY_RETRY_AFTER)
        self.metrics.count(model_label, NO_BACKEND, 429)

    async def _fail_internal(self, send: Send, flight: Flight, model_label: str) -> None:
        try:
            if not flight.started:
                await self._error(send, flight, 500, "internal gateway error", errors.INTERNAL, "internal_error")
            elif flight.sse:
                await send({"type": "http.response.body", "more_body": True,
                            "body": errors.sse_error_event("internal gateway error", 500)})
            # Mid-response, returning without the final body message drops the connection.
        except Exception:
            log.exception("could not report an internal error to the client")
        self.metrics.count(model_label, NO_BACKEND, 500)

    async def _forward(self, scope: Scope, send: Send, body: bytes, doc: dict[str, Any], model: str,
                       hint: Hint | None, t0: float, flight: Flight, loop: asyncio.AbstractEventLoop) -> None:
        headers, request_id = upstream_headers(scope, self._drop_auth, self._upstream_key, self._ids)
        target = scope["path"].encode()  # routable() allowed only ASCII; the query string goes as received
        if scope["query_string"]:
            target += b"?" + scope["query_string"]
        start = loop.time()
        deadline = start + self._total_s
        out = Outbound(model, target, headers, request_id, hint, flight, loop)
        tried: list[Backend] = []
        try:
            leg = await self.opener.open(out, body, tried, start, deadline)
        except OpenFailed as e:
            await self._error(send, flight, e.status, str(e), e.type, e.code,
                              headers=self._retry_after() if e.retry_after else None)
            self.metrics.count(model, e.backend.name if e.backend else NO_BACKEND, e.status)
            return
        conn, backend = leg.conn, leg.backend
        # One pass over the head: what goes to the client, and is_sse()'s answer (about half the
        # time of a comprehension plus is_sse's own pass, each lower-casing every name).
        out_headers = []
        sse = False
        for k, v in conn.headers:
            name = k.lower()
            if name not in _DROP_RESPONSE_HEADERS:
                out_headers.append((k, v))
                if name == b"content-type" and v.startswith(b"text/event-stream"):
                    sse = True
        out_headers.append((b"x-request-id", request_id))
        out_headers.append((b"x-fleet-backend", backend.name.encode()))
        flight.sse = sse
        try:
            flight.started = True
            await send({"type": "http.response.start", "status": conn.status, "headers": out_headers})
            if conn.complete:
                # The whole body came with the head (a non-streamed answer): one message, so a chunked
                # response's last chunk and terminator go out in one write.
                self.metrics.observe_ttfb(model, time.perf_counter() - t0)
                flight.done = True
                # Nothing the client does can cancel the request now: stop watching before the last
                # send, whose end of the response would otherwise wake the watcher (a future's result,
                # a callback, a coroutine step) only for it to find nothing to do.
                flight.stop()
                whole = conn.take_body()
                path = scope["path"]
                record_tokens_later((lambda: stream_tokens(path, whole)) if flight.sse
                                    else (lambda: completion_tokens(whole)), len(whole))
                await send({"type": "http.response.body", "body": whole, "more_body": False})
        except BaseException:
            self.opener.release(leg)
            if flight.gone:
                self.metrics.count(model, backend.name, CLIENT_CLOSED)
            raise
        if conn.complete:
            self.opener.release(leg)
            self._answered(model, backend, conn.status, t0)
            return
        def first_byte() -> None:
            self.metrics.observe_ttfb(model, time.perf_counter() - t0)

        # A body still to come: relayed by Stream, which continues a broken completion stream on
        # another replica where it can, and releases every leg it used.
        plan = plan_for(scope["path"], doc, self.settings.max_migrations)
        writes = scope.get(BODY_WRITE)  # the gateway's own protocol's (coalesce.py); absent under others
        stream = Stream(self.streams, send, out, plan, deadline, tried, first_byte,
                        writes(scope) if writes is not None else None)
        try:
            ended = await stream.run(leg)
        finally:  # also when the client left right after [DONE] and took the task with it
            if stream.transcript is not None:
                record_tokens_later(stream.transcript.counter())  # counted if the console reads it
        if ended is not None:
            self._answered(model, ended, conn.status, t0)

    def _answered(self, model: str, backend: Backend, status: int, t0: float) -> None:
        self.metrics.count(model, backend.name, status)
        self.metrics.observe_duration(model, time.perf_counter() - t0)
