"""The hot path: a raw ASGI endpoint that relays POST /v1/* to a replica chosen by ``model``.

Bytes go through as they arrive: the request body as received, the response chunk by chunk via
aiohttp (DESIGN §3: a fraction of httpx's CPU per event). The order of events for one request:

1. read the body (capped), take ``model`` from it, pick a healthy replica;
2. send it; while no response has started, a connect failure, a reset before any response, or
   a 503 sends it to another replica (at most ``max_attempts`` tries);
3. relay status, headers and body; the first body byte fixes time to first byte;
4. if the upstream fails after the first byte, an SSE stream gets an OpenAI error event and the
   connection is dropped without ``[DONE]`` so no client mistakes it for a complete answer.

A watcher on ``receive()`` cancels the request the moment the client goes away, in every phase,
so that closing the upstream connection makes vLLM abort the generation.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
from starlette.types import Receive, Scope, Send

from gateway import errors
from gateway.backend import Backend
from gateway.inbound import SAFE_PATH, BadRequest, ClientGone, model_of, read_body, upstream_headers
from gateway.metrics import NO_BACKEND, UNKNOWN_MODEL, GatewayMetrics
from gateway.pool import BackendPool
from gateway.settings import GatewaySettings

log = logging.getLogger("gateway.proxy")

# Failures that prove the request did no work upstream, so another replica may take it.
_RETRYABLE = (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
_DROP_RESPONSE_HEADERS = frozenset({
    b"connection", b"keep-alive", b"transfer-encoding", b"upgrade", b"trailer", b"date", b"server",
    b"proxy-authenticate",
})
_CLIENT_CLOSED = 499  # nginx's code for "client closed request", used as a metrics label only


class _Watch:
    """Cancels the request task when the client disconnects, unless the response is finished."""

    __slots__ = ("done", "gone")

    def __init__(self) -> None:
        self.done = False
        self.gone = False

    async def run(self, receive: Receive, task: asyncio.Task[object]) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                if not self.done:
                    self.gone = True
                    task.cancel()
                return


class Proxy:
    def __init__(self, pool: BackendPool, settings: GatewaySettings, metrics: GatewayMetrics) -> None:
        self.pool = pool
        self.settings = settings
        self.metrics = metrics
        self.session: aiohttp.ClientSession | None = None
        self._drop_auth = bool(settings.keys())

    async def start(self) -> None:
        # No pool limit: backpressure is the backends' queues' job, not a hidden connector queue.
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)
        self.session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,  # relay bytes exactly as the upstream sent them
            timeout=aiohttp.ClientTimeout(total=None, connect=self.settings.connect_timeout_s),
            skip_auto_headers=("Accept-Encoding", "User-Agent"),
        )

    async def stop(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        model_label = UNKNOWN_MODEL
        try:
            if not SAFE_PATH.match(scope["path"]):
                raise BadRequest(404, f"no route for POST {scope['path']}", "not_found")
            body = await read_body(scope, receive, self.settings.max_body_bytes)
            model = model_of(body)
            if self.pool.knows(model):
                model_label = model
            elif self.pool.discovering:
                raise BadRequest(503, f"model '{model}' is not known yet: backends are still being discovered",
                                 "no_healthy_backend", "model")
            else:
                served = ", ".join(self.pool.served_models()) or "(none)"
                raise BadRequest(404, f"The model '{model}' does not exist. Served models: {served}",
                                 "model_not_found", "model")
        except ClientGone:
            self.metrics.count(model_label, NO_BACKEND, _CLIENT_CLOSED)
            return
        except BadRequest as e:
            await self._reject(send, e, model_label)
            return
        watch = _Watch()
        task = asyncio.current_task()
        assert task is not None
        watcher = asyncio.ensure_future(watch.run(receive, task))
        try:
            await self._forward(scope, send, body, model, t0, watch)
        except asyncio.CancelledError:
            if not watch.gone:
                raise  # server shutdown, not the client: let it propagate
            # cancel() has been consumed; the task goes on to finish normally.
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
        finally:
            watch.done = True
            watcher.cancel()

    async def _reject(self, send: Send, e: BadRequest, model_label: str) -> None:
        headers = [(b"retry-after", str(max(1, round(self.settings.health_interval_s))).encode())] \
            if e.status == 503 else None
        type_ = errors.UNAVAILABLE if e.status == 503 else errors.INVALID_REQUEST
        await errors.send_error(send, e.status, str(e), type_, e.code, e.param, headers)
        self.metrics.count(model_label, NO_BACKEND, e.status)

    async def _forward(self, scope: Scope, send: Send, body: bytes, model: str, t0: float, watch: _Watch) -> None:
        assert self.session is not None
        headers, request_id = upstream_headers(scope, self._drop_auth, self.settings.upstream_api_key)
        target = scope["path"] + ("?" + scope["query_string"].decode("latin-1") if scope["query_string"] else "")
        tried: list[Backend] = []
        last_failure = "no healthy replica"
        resp: aiohttp.ClientResponse | None = None
        backend: Backend | None = None
        while len(tried) < self.settings.max_attempts:
            backend = self.pool.pick(model, tried)
            if backend is None:
                break
            if tried:
                self.metrics.retries.labels(model).inc()
            tried.append(backend)
            backend.in_flight += 1
            self.metrics.in_flight.labels(backend.name).inc()
            try:
                async with asyncio.timeout(self.settings.headers_timeout_s):
                    resp = await self.session.request("POST", backend.url + target, data=body, headers=headers)
            except _RETRYABLE as e:
                last_failure = f"{backend.name}: {e.__class__.__name__}: {e}"
                self.metrics.upstream_failures.labels(backend.name, "connect").inc()
                self._release(backend)
                continue
            except TimeoutError:
                self.metrics.upstream_failures.labels(backend.name, "headers").inc()
                self._release(backend)
                await errors.send_error(send, 504, f"{backend.name} sent no response headers within "
                                        f"{self.settings.headers_timeout_s}s", errors.UPSTREAM, "upstream_timeout")
                self.metrics.count(model, backend.name, 504)
                return
            except BaseException:
                self._release(backend)
                if watch.gone:
                    self.metrics.count(model, backend.name, _CLIENT_CLOSED)
                raise
            if resp.status == 503 and len(tried) < self.settings.max_attempts \
                    and self.pool.pick(model, tried) is not None:
                last_failure = f"{backend.name} answered 503"
                resp.close()
                self._release(backend)
                resp = None
                continue
            break
        if resp is None or backend is None:
            status = 503 if not tried else 502
            await errors.send_error(
                send, status, f"no replica of '{model}' could take the request ({last_failure})",
                errors.UNAVAILABLE if status == 503 else errors.UPSTREAM,
                "no_healthy_backend" if status == 503 else "upstream_unreachable",
                headers=[(b"retry-after", str(max(1, round(self.settings.health_interval_s))).encode())],
            )
            self.metrics.count(model, NO_BACKEND if not tried else tried[-1].name, status)
            return
        try:
            await self._relay(send, resp, backend, model, request_id, t0, watch)
        finally:
            resp.close()
            self._release(backend)

    def _release(self, backend: Backend) -> None:
        backend.in_flight -= 1
        self.metrics.in_flight.labels(backend.name).dec()

    async def _relay(self, send: Send, resp: aiohttp.ClientResponse, backend: Backend, model: str,
                     request_id: str, t0: float, watch: _Watch) -> None:
        out_headers = [(k, v) for k, v in resp.raw_headers if k.lower() not in _DROP_RESPONSE_HEADERS]
        out_headers.append((b"x-request-id", request_id.encode("latin-1")))
        out_headers.append((b"x-fleet-backend", backend.name.encode()))
        sse = resp.headers.get("content-type", "").startswith("text/event-stream")
        code: int = resp.status
        first = True
        loop = asyncio.get_running_loop()
        idle_s = self.settings.idle_timeout_s
        try:
            await send({"type": "http.response.start", "status": resp.status, "headers": out_headers})
            async with asyncio.timeout_at(loop.time() + idle_s) as idle:
                # Re-arming the idle timer at most once a second keeps its cost off the per-chunk path.
                rearm_at = loop.time() + 1.0
                async for chunk in resp.content.iter_any():
                    if first:
                        first = False
                        self.metrics.observe_ttfb(model, time.perf_counter() - t0)
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    now = loop.time()
                    if now >= rearm_at:
                        idle.reschedule(now + idle_s)
                        rearm_at = now + 1.0
        except (aiohttp.ClientError, TimeoutError) as e:
            if watch.gone:
                raise asyncio.CancelledError from e
            self.metrics.upstream_failures.labels(backend.name, "stream").inc()
            what = "went silent" if isinstance(e, TimeoutError) else f"failed: {e.__class__.__name__}"
            log.warning("upstream %s %s mid-response (request %s)", backend.name, what, request_id)
            if sse:
                await send({"type": "http.response.body", "more_body": True,
                            "body": errors.sse_error_event(f"upstream {backend.name} {what} mid-stream")})
            self.metrics.count(model, backend.name, 502)
            # Returning without the final body message makes the server drop the connection:
            # the client sees a truncated response, never a clean end.
            return
        except asyncio.CancelledError:
            if watch.gone:
                self.metrics.count(model, backend.name, _CLIENT_CLOSED)
            raise
        if first:
            self.metrics.observe_ttfb(model, time.perf_counter() - t0)
        watch.done = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        self.metrics.count(model, backend.name, code)
        self.metrics.observe_duration(model, time.perf_counter() - t0)
