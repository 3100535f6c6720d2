"""The hot path: a raw ASGI endpoint that relays POST /v1/* to a replica chosen by ``model``.

Bytes go through as they arrive: the request body as received, the response chunk by chunk through
the gateway's own HTTP/1.1 client (upstream.py, connection.py), whose parser callback hands each
chunk to the client's ``send`` in place (relay.py), with no task wake-up per chunk. The order of
events for one request:

1. read the body (capped), take ``model`` from it and check the caps (one JSON parse), enter the
   gateway-wide in-flight cap, take a slot on a replica or wait for one (limiter.py);
2. send it; while no response has started, a connect failure, a reset before any response, or
   a 503 sends it to another replica after a jittered pause (retry.py: attempts and a deadline);
3. relay status, headers and body; the first body byte fixes time to first byte;
4. if the upstream fails after the first byte, or the total timeout strikes, an SSE stream gets an
   OpenAI error event and the connection is dropped without ``[DONE]`` so no client mistakes it for
   a complete answer.

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

from starlette.types import Receive, Scope, Send

from gateway import errors
from gateway.backend import Backend
from gateway.connection import ConnectFailed, ResetBeforeResponse, UpstreamConnection, UpstreamError
from gateway.ejection import FAILURE_STATUSES, Ejector
from gateway.inbound import (
    SAFE_PATH,
    BadRequest,
    ClientGone,
    Flight,
    RequestIds,
    header,
    model_of,
    read_body,
    upstream_headers,
)
from gateway.limiter import Limiter, Rejected
from gateway.metrics import NO_BACKEND, UNKNOWN_MODEL, GatewayMetrics
from gateway.pool import BackendPool
from gateway.relay import ClientRelay
from gateway.retry import RetryPolicy
from gateway.routing import Hint, hint_for
from gateway.settings import GatewaySettings
from gateway.upstream import Origin, UpstreamPool

log = logging.getLogger("gateway.proxy")

# Failures that prove the request did no work upstream, so another replica may take it.
_RETRYABLE = (ConnectFailed, ResetBeforeResponse)
_DROP_RESPONSE_HEADERS = frozenset({
    b"connection", b"keep-alive", b"transfer-encoding", b"upgrade", b"trailer", b"date", b"server",
    b"proxy-authenticate",
})
_CLIENT_CLOSED = 499  # nginx's code for "client closed request", used as a metrics label only
_BUSY_RETRY_AFTER = [(b"retry-after", b"1")]


class Proxy:
    def __init__(self, pool: BackendPool, settings: GatewaySettings, metrics: GatewayMetrics,
                 limiter: Limiter, ejector: Ejector) -> None:
        self.pool = pool
        self.settings = settings
        self.metrics = metrics
        self.limiter = limiter
        self.ejector = ejector
        self.retry = RetryPolicy(settings)
        self.upstream = UpstreamPool(settings.connect_timeout_s)
        self._drop_auth = bool(settings.keys())
        self._upstream_key = settings.upstream_api_key.encode("latin-1") if settings.upstream_api_key else None
        self._total_s = settings.total_timeout_s or math.inf
        self._ids = RequestIds()
        self._affinity_header = settings.affinity_header.lower().encode("latin-1")

    async def stop(self) -> None:
        self.upstream.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        flight = Flight()
        try:
            await self._serve(scope, receive, send, flight)
        except Exception:
            # A bug, not a client or upstream failure: log the trace, show the client only the envelope.
            log.exception("unexpected error relaying %s", scope.get("path"))
            await self._fail_internal(send, flight, UNKNOWN_MODEL)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, flight: Flight) -> None:
        t0 = time.perf_counter()
        model_label = UNKNOWN_MODEL
        s = self.settings
        try:
            if not SAFE_PATH.match(scope["path"]):
                raise BadRequest(404, f"no route for POST {scope['path']}", "not_found")
            body = await read_body(scope, receive, s.max_body_bytes)
            model, doc = model_of(body, s.max_tokens_cap, s.max_n_cap)
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
            self.metrics.count(model_label, NO_BACKEND, _CLIENT_CLOSED)
            return
        except BadRequest as e:
            await self._reject(send, flight, e, model_label)
            return
        except Rejected as e:
            await self._busy(send, flight, e, model_label)
            return
        task = asyncio.current_task()
        assert task is not None
        flight.watch(receive, task)
        try:
            await self._forward(scope, send, body, model, hint, t0, flight)
        except asyncio.CancelledError:
            if not flight.gone:
                raise  # server shutdown, not the client: let it propagate
            # cancel() has been consumed; the task goes on to finish normally.
            task.uncancel()
        except Rejected as e:
            await self._busy(send, flight, e, model)
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

    async def _forward(self, scope: Scope, send: Send, body: bytes, model: str, hint: Hint | None, t0: float,
                       flight: Flight) -> None:
        headers, request_id = upstream_headers(scope, self._drop_auth, self._upstream_key, self._ids)
        target = scope["path"].encode()  # SAFE_PATH allowed only ASCII; the query string goes as received
        if scope["query_string"]:
            target += b"?" + scope["query_string"]
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + self._total_s
        retry_end = min(deadline, start + self.retry.deadline_s)
        tried: list[Backend] = []
        last_failure = "no healthy replica"
        conn: UpstreamConnection | None = None
        origin: Origin | None = None
        backend: Backend | None = None
        pause: float | None = 0.0
        while pause is not None:
            if pause:
                await asyncio.sleep(pause)
            backend = await self.limiter.acquire(model, tried, retry_end if tried else deadline, hint)
            if backend is None:
                break
            if tried:
                self.metrics.retries.labels(model).inc()
            tried.append(backend)
            try:
                origin, request = self.upstream.request(backend.url, target, headers, body)
                conn = await self.upstream.send(origin, request,
                                                min(loop.time() + self.settings.headers_timeout_s, deadline))
            except _RETRYABLE as e:
                last_failure = f"{backend.name}: {e.__class__.__name__}: {e}"
                self.metrics.upstream_failures.labels(backend.name, "connect").inc()
                self.ejector.failure(backend, last_failure)
                self.limiter.release(backend)
                pause = self.retry.backoff(len(tried), loop.time() - start)
                continue
            except TimeoutError:
                self.limiter.release(backend)
                await self._headers_timeout(send, flight, backend, model, loop.time() >= deadline - 0.01)
                return
            except UpstreamError as e:
                # An answer that is not HTTP: the request may have done work, so no retry.
                self.limiter.release(backend)
                last_failure = f"{backend.name}: {e}"
                self.ejector.failure(backend, last_failure)
                await self._error(send, flight, 502, f"bad response from upstream ({last_failure})",
                                  errors.UPSTREAM, "upstream_unreachable")
                self.metrics.count(model, backend.name, 502)
                return
            except BaseException:
                self.limiter.release(backend)
                if flight.gone:
                    self.metrics.count(model, backend.name, _CLIENT_CLOSED)
                raise
            if conn.status in FAILURE_STATUSES:
                self.ejector.failure(backend, f"answered {conn.status}")
            else:
                backend.request_failures = 0
            if conn.status == 503:
                pause = self.retry.backoff(len(tried), loop.time() - start)
                if pause is not None and self.pool.has_other(model, tried):
                    last_failure = f"{backend.name} answered 503"
                    conn.abort()
                    self.limiter.release(backend)
                    conn = None
                    continue
            break
        if conn is None or backend is None or origin is None:
            status = 503 if not tried else 502
            await self._error(
                send, flight, status, f"no replica of '{model}' could take the request ({last_failure})",
                errors.UNAVAILABLE if status == 503 else errors.UPSTREAM,
                "no_healthy_backend" if status == 503 else "upstream_unreachable", headers=self._retry_after())
            self.metrics.count(model, NO_BACKEND if not tried else tried[-1].name, status)
            return
        try:
            await self._relay(send, conn, backend, model, request_id, t0, flight, deadline)
        finally:
            # Back to the pool only after a clean, complete response; aborted otherwise (cancel included).
            self.upstream.release(conn, origin)
            self.limiter.release(backend)

    async def _headers_timeout(self, send: Send, flight: Flight, backend: Backend, model: str, total: bool) -> None:
        if total:
            # The gateway's own budget for the request ran out; not the backend's failure.
            message = f"the request exceeded the gateway's total timeout of {self.settings.total_timeout_s}s"
            code = "request_timeout"
        else:
            message = f"{backend.name} sent no response headers within {self.settings.headers_timeout_s}s"
            code = "upstream_timeout"
            self.metrics.upstream_failures.labels(backend.name, "headers").inc()
            self.ejector.failure(backend, message)
        await self._error(send, flight, 504, message, errors.UPSTREAM, code)
        self.metrics.count(model, backend.name, 504)

    async def _relay(self, send: Send, conn: UpstreamConnection, backend: Backend, model: str,
                     request_id: bytes, t0: float, flight: Flight, deadline: float) -> None:
        out_headers = [(k, v) for k, v in conn.headers if k.lower() not in _DROP_RESPONSE_HEADERS]
        out_headers.append((b"x-request-id", request_id))
        out_headers.append((b"x-fleet-backend", backend.name.encode()))
        flight.sse = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in conn.headers)
        idle_s = self.settings.idle_timeout_s

        def first_byte() -> None:
            self.metrics.observe_ttfb(model, time.perf_counter() - t0)

        relay = ClientRelay(send, first_byte)
        try:
            flight.started = True
            await send({"type": "http.response.start", "status": conn.status, "headers": out_headers})
            if conn.complete:
                # The whole body came with the head (a non-streamed answer): one message, so a chunked
                # response's last chunk and terminator go out in one write.
                first_byte()
                flight.done = True
                await send({"type": "http.response.body", "body": conn.take_body(), "more_body": False})
                self._answered(model, backend, conn.status, t0)
                return
            conn.attach(relay)
            while not await conn.body_end(idle_s, deadline):
                # The client is slow: finish its pending write, then let the upstream go on.
                async with asyncio.timeout_at(deadline):
                    await relay.drain()
                conn.resume()
            await relay.drain()  # a failure of the server's send surfaces here, never in the parser
        except (UpstreamError, TimeoutError) as e:
            if flight.gone:
                raise asyncio.CancelledError from e
            loop = asyncio.get_running_loop()
            if isinstance(e, TimeoutError) and loop.time() >= deadline - 0.01:
                what, status = f"exceeded the gateway's total timeout of {self.settings.total_timeout_s}s", 504
            else:
                what = "went silent" if isinstance(e, TimeoutError) else f"failed: {e.__class__.__name__}"
                status = 502
                self.metrics.upstream_failures.labels(backend.name, "stream").inc()
                self.ejector.failure(backend, f"{what} mid-response")
            log.warning("upstream %s %s mid-response (request %s)", backend.name, what, request_id.decode("latin-1"))
            if flight.sse:
                await send({"type": "http.response.body", "more_body": True,
                            "body": errors.sse_error_event(f"upstream {backend.name} {what} mid-stream", status)})
            self.metrics.count(model, backend.name, status)
            # Returning without the final body message makes the server drop the connection:
            # the client sees a truncated response, never a clean end.
            return
        except asyncio.CancelledError:
            if flight.gone:
                self.metrics.count(model, backend.name, _CLIENT_CLOSED)
            raise
        if not relay.started:
            first_byte()
        flight.done = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        self._answered(model, backend, conn.status, t0)

    def _answered(self, model: str, backend: Backend, status: int, t0: float) -> None:
        self.metrics.count(model, backend.name, status)
        self.metrics.observe_duration(model, time.perf_counter() - t0)
