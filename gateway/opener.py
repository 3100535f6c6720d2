"""Opening a request on a replica: take a slot on one (limiter.py), send, wait for the response head,
and go to another replica while the request provably did no work there (connect refused or timed
out, a reset before any response, a 503), after retry.py's jittered pause, within its attempts and
deadline. Used for a request's first leg and for a broken stream's continuation (stream.py).

Whatever fails is told to the caller as ``OpenFailed`` with the status, code and message the client
is to see (the envelope before headers, the error event mid-stream); addresses and exception names
go to the log only.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from gateway import errors
from gateway.backend import Backend
from gateway.connection import ConnectFailed, ResetBeforeResponse, UpstreamConnection, UpstreamError
from gateway.ejection import FAILURE_STATUSES, Ejector
from gateway.inbound import Flight
from gateway.limiter import Limiter
from gateway.metrics import GatewayMetrics
from gateway.pool import BackendPool
from gateway.retry import RetryPolicy
from gateway.routing import Hint
from gateway.settings import GatewaySettings
from gateway.upstream import Origin, UpstreamPool

log = logging.getLogger("gateway.proxy")

# Failures that prove the request did no work upstream, so another replica may take it.
_RETRYABLE = (ConnectFailed, ResetBeforeResponse)
CLIENT_CLOSED = 499  # nginx's code for "client closed request", used as a metrics label only


@dataclass(slots=True)
class Outbound:
    """What every leg of one client request sends, whichever replica it goes to. Not frozen, though
    nothing changes it: a frozen dataclass's __init__ costs 0.5 µs more (object.__setattr__ per field)."""

    model: str
    target: bytes  # path and query
    headers: bytes  # the header block (upstream_headers)
    request_id: bytes
    hint: Hint | None
    flight: Flight
    loop: asyncio.AbstractEventLoop  # the request's: asyncio.get_running_loop() is a getpid(2) on 3.11


@dataclass(slots=True)
class Leg:
    """One replica's response to one request: its connection, whose head is in, and its slot."""

    conn: UpstreamConnection
    origin: Origin
    backend: Backend
    drained: bool = False  # ended by the gateway because the backend is draining, not by a failure


class OpenFailed(Exception):
    """No leg could be opened; what the client is to be told."""

    def __init__(self, status: int, message: str, type_: str, code: str, backend: Backend | None,
                 retry_after: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.code = code
        self.backend = backend  # the replica that answered last; None when none was reached
        self.retry_after = retry_after


class Opener:
    def __init__(self, pool: BackendPool, settings: GatewaySettings, metrics: GatewayMetrics, limiter: Limiter,
                 ejector: Ejector, upstream: UpstreamPool) -> None:
        self.pool = pool
        self.settings = settings
        self.metrics = metrics
        self.limiter = limiter
        self.ejector = ejector
        self.upstream = upstream
        self.retry = RetryPolicy(settings)

    async def open(self, out: Outbound, body: bytes, tried: list[Backend], start: float, deadline: float) -> Leg:
        """A leg on a replica not in ``tried`` (each one tried is appended). ``start``: when this
        opening began, for the retry deadline. Raises OpenFailed, limiter.Rejected, or the cancel."""
        loop = out.loop
        model = out.model
        retry_end = min(deadline, start + self.retry.deadline_s)
        attempts = 0
        last_failure = "no healthy replica"
        pause: float | None = 0.0
        while pause is not None:
            if pause:
                await asyncio.sleep(pause)
            backend = await self.limiter.acquire(model, tried, retry_end if attempts else deadline, out.hint)
            if backend is None:
                break
            if attempts:
                self.metrics.retries.labels(model).inc()
            attempts += 1
            tried.append(backend)
            try:
                origin, request = self.upstream.request(backend.url, out.target, out.headers, body)
                conn = await self.upstream.send(origin, request,
                                                min(loop.time() + self.settings.headers_timeout_s, deadline))
            except _RETRYABLE as e:
                last_failure = f"{backend.name}: {e.__class__.__name__}: {e}"
                self.metrics.upstream_failures.labels(backend.name, "connect").inc()
                self.ejector.failure(backend, last_failure)
                self.limiter.release(backend)
                pause = self.retry.backoff(attempts, loop.time() - start)
                continue
            except TimeoutError:
                self.limiter.release(backend)
                raise self._headers_timeout(backend, loop.time() >= deadline - 0.01) from None
            except UpstreamError as bad:  # not ``e``: mypyc types a name by its first except (proxy.py)
                # An answer that is not HTTP: the request may have done work, so no retry.
                self.limiter.release(backend)
                last_failure = f"{backend.name}: {bad}"
                self.ejector.failure(backend, last_failure)
                log.warning("request %s: malformed response from %s", out.request_id.decode("latin-1"), last_failure)
                raise OpenFailed(502, f"replica {backend.name} of '{model}' sent a malformed response",
                                 errors.UPSTREAM, "upstream_unreachable", backend) from None
            except BaseException:
                self.limiter.release(backend)
                if out.flight.gone:
                    self.metrics.count(model, backend.name, CLIENT_CLOSED)
                raise
            if conn.status in FAILURE_STATUSES:
                self.ejector.failure(backend, f"answered {conn.status}")
            else:
                self.ejector.success(backend)
            if conn.status == 503:
                pause = self.retry.backoff(attempts, loop.time() - start)
                if pause is not None and self.pool.has_other(model, tried):
                    last_failure = f"{backend.name} answered 503"
                    conn.abort()
                    self.limiter.release(backend)
                    continue
            return Leg(conn, origin, backend)
        # Every try failed before the request did any work (refused, reset before a response, or a
        # 503), or no replica was in rotation: the client may simply come back later.
        if attempts:
            log.warning("request %s: no replica of %s could take it after %d tries (last: %s)",
                        out.request_id.decode("latin-1"), model, attempts, last_failure)
        raise OpenFailed(503, f"no replica of '{model}' can take the request now; retry later", errors.UNAVAILABLE,
                         "no_healthy_backend", tried[-1] if attempts else None, retry_after=True)

    def _headers_timeout(self, backend: Backend, total: bool) -> OpenFailed:
        if total:
            # The gateway's own budget for the request ran out; not the backend's failure.
            return OpenFailed(504, f"the request exceeded the gateway's total timeout of "
                              f"{self.settings.total_timeout_s}s", errors.UPSTREAM, "request_timeout", backend)
        message = f"{backend.name} sent no response headers within {self.settings.headers_timeout_s}s"
        self.metrics.upstream_failures.labels(backend.name, "headers").inc()
        self.ejector.failure(backend, message)
        return OpenFailed(504, message, errors.UPSTREAM, "upstream_timeout", backend)

    def release(self, leg: Leg) -> None:
        """The leg is over: its connection back to the pool after a clean, complete response (else
        aborted, which makes vLLM stop generating), its slot to the next request."""
        self.upstream.release(leg.conn, leg.origin)
        self.limiter.release(leg.backend)
