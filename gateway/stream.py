"""One response body to the client, relayed from an upstream leg and, when the leg breaks in the
middle of a streamed chat or text completion, continued from another replica as one stream
(docs/stream-failover.md).

A leg breaks when its connection resets or closes before the end of the body, when it stays silent
for ``idle_timeout_s``, or when the gateway ends it because its backend is draining (``Streams``
follows the backend set: on DRAINING it ends every stream on that backend that can continue
elsewhere, so that they move before the backend goes). Then, in order:

1. the request's shape rules a continuation out (migration.Plan) → the error event;
2. the total timeout has passed → the error event;
3. the client already has the whole answer (a finish reason, or ``max_tokens`` used up) → the
   stream is closed normally (``[DONE]``);
4. a tool call or reasoning was being streamed, or ``FLEET_MAX_MIGRATIONS`` continuations were made,
   or no replica that has not failed this request is in rotation → the error event;
5. otherwise a continuation goes to another replica (opener.py: the same retry rules as a first
   try), and its events are rewritten into the client's stream (sse.Splice).

The error event is the one every stream got before this existed (DESIGN §2): an OpenAI error event,
then the connection dropped without ``[DONE]``; its message says why the stream did not continue.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import NamedTuple

from starlette.types import Send

from gateway import errors, migration
from gateway.backend import Backend, BackendSet
from gateway.connection import UpstreamError
from gateway.ejection import Ejector
from gateway.limiter import Rejected
from gateway.metrics import GatewayMetrics
from gateway.opener import CLIENT_CLOSED, Leg, Opener, OpenFailed, Outbound
from gateway.pool import BackendPool
from gateway.relay import ClientRelay, SpliceRelay, StreamRelay, Write
from gateway.settings import GatewaySettings
from gateway.sse import Splice, Transcript
from gateway.state import BackendState
from gateway.tokencount import recount

log = logging.getLogger("gateway.proxy")


class _Refused(NamedTuple):
    outcome: str
    why: str


def is_sse(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers)


class Streams:
    """What every stream shares, and the streams relaying from each backend now (a subscriber of
    the backend set, docs/architecture.md §2: it reads states and ends legs, never moves a backend)."""

    def __init__(self, backends: BackendSet, pool: BackendPool, settings: GatewaySettings, metrics: GatewayMetrics,
                 ejector: Ejector, opener: Opener) -> None:
        self.pool = pool
        self.settings = settings
        self.metrics = metrics
        self.ejector = ejector
        self.opener = opener
        self.upstream_key = settings.upstream_api_key.encode("latin-1") if settings.upstream_api_key else None
        self._on: dict[Backend, set[Stream]] = {}
        backends.subscribe(self._changed)

    def on(self, s: Stream, b: Backend) -> None:
        self._on.setdefault(b, set()).add(s)
        if b.state is BackendState.DRAINING:
            s.drain()  # its response head came in after the drain began

    def off(self, s: Stream, b: Backend) -> None:
        streams = self._on.get(b)
        if streams is not None:
            streams.discard(s)
            if not streams:
                del self._on[b]

    def _changed(self, b: Backend, old: BackendState | None, new: BackendState | None) -> None:
        streams = self._on.get(b)
        if new is BackendState.DRAINING and streams:
            # Each decision may parse up to 64 KiB of a stream's events: one loop turn per stream,
            # not one stall of the writer's call for all of them.
            loop = asyncio.get_running_loop()
            for s in list(streams):
                loop.call_soon(s.drain)


class Stream:
    """One client's response body. ``run`` relays it to its end, across legs where it may."""

    def __init__(self, streams: Streams, send: Send, out: Outbound, plan: migration.Plan | None, deadline: float,
                 tried: list[Backend], first_byte: Callable[[], None], write: Write | None = None) -> None:
        self.streams = streams
        self.send = send
        self.write = write  # the server's chunk write, where it has one (relay.py)
        self.out = out
        self.plan = plan
        self.deadline = deadline
        self.tried = tried  # replicas this request has been on: a continuation never goes back to one
        self._first_byte = first_byte
        self._started = False
        self.sse = False
        self.counted = False  # a streamed completion: every break is counted with its outcome
        self.transcript: Transcript | None = None
        self.leg: Leg | None = None  # the leg relaying now, while it is registered for drains
        self.migrations = 0

    async def run(self, leg: Leg) -> Backend | None:
        """Relay to the end. The backend that ended the body, or None when the client got the error
        event instead (then the request is counted here)."""
        self.sse = is_sse(leg.conn.headers)
        self.counted = self.plan is not None and self.sse and leg.conn.status == 200
        relay: ClientRelay
        if self.counted and self.plan is not None and self.plan.migratable:
            self.transcript = Transcript(self.plan.chat)
            relay = StreamRelay(self.send, self._first, self.transcript, self.write)
        else:
            relay = ClientRelay(self.send, self._first, self.write)
        while True:
            if self.transcript is not None:
                self.leg = leg
                self.streams.on(self, leg.backend)
            try:
                await self._pump(leg, relay)
            except (UpstreamError, TimeoutError) as e:
                self._end(leg)
                if self.out.flight.gone:
                    raise asyncio.CancelledError from e
                after = await self._after_break(leg, e, relay)
                if after is None:
                    return None
                if isinstance(after, bytes):
                    return await self._close(leg.backend, after)
                leg, relay = after
                continue
            except BaseException:
                self._end(leg)
                if self.out.flight.gone:
                    self.streams.metrics.count(self.out.model, leg.backend.name, CLIENT_CLOSED)
                raise
            self._end(leg)
            return await self._close(leg.backend, relay.tail())

    async def _pump(self, leg: Leg, relay: ClientRelay) -> None:
        conn, idle_s = leg.conn, self.streams.settings.idle_timeout_s
        conn.attach(relay)
        self.out.flight.answered = relay.answered
        while not await conn.body_end(idle_s, self.deadline):
            # The client is slow: finish its pending write, then let the upstream go on.
            async with asyncio.timeout_at(self.deadline):
                await relay.drain()
            conn.resume()
        await relay.drain()  # a failure of the server's send surfaces here, never in the parser

    def _first(self) -> None:
        if not self._started:
            self._started = True
            self._first_byte()

    def _end(self, leg: Leg) -> None:
        if self.leg is leg:
            self.leg = None
            self.streams.off(self, leg.backend)
        self.streams.opener.release(leg)

    async def _close(self, backend: Backend, last: bytes) -> Backend:
        self._first()
        self.out.flight.done = True
        await self.send({"type": "http.response.body", "body": last, "more_body": False})
        return backend

    def drain(self) -> None:
        """The leg's backend is draining: end the leg so that the stream continues elsewhere, if it
        can; otherwise it finishes where it is."""
        leg, t = self.leg, self.transcript
        if leg is None or t is None or leg.drained or self.migrations >= self.streams.settings.max_migrations:
            return  # already ended or moved, or out of continuations
        if leg.backend.state is not BackendState.DRAINING:
            return  # the drain was cancelled before this stream's turn
        if not self.streams.pool.has_other(self.out.model, self.tried):
            return
        t.compact()
        if t.ended or migration.refusal_after(t) is not None:
            return
        leg.drained = True
        leg.conn.abort()  # connection_lost fails the leg's body_end: run() takes it from there

    async def _after_break(self, leg: Leg, e: Exception,
                           relay: ClientRelay) -> tuple[Leg, ClientRelay] | bytes | None:
        """What follows a broken leg: the next leg and its relay, the bytes that close a stream whose
        answer is complete, or None once the client got the error event."""
        s = self.streams
        loop = asyncio.get_running_loop()
        broke = loop.time()
        b, model = leg.backend, self.out.model
        total = isinstance(e, TimeoutError) and broke >= self.deadline - 0.01
        if leg.drained:
            what = "was drained"
        elif total:
            what = f"exceeded the gateway's total timeout of {s.settings.total_timeout_s}s"
        else:
            what = "went silent" if isinstance(e, TimeoutError) else "failed"
            s.metrics.upstream_failures.labels(b.name, "stream").inc()
            s.ejector.failure(b, f"{what} mid-response")
        stalled = False
        try:
            async with asyncio.timeout_at(self.deadline):
                await relay.drain()  # a send the slow client left pending goes first
        except TimeoutError:
            total = stalled = True
        outcome, why = None, ""
        plan, t = self.plan, self.transcript
        if not self.counted or plan is None:
            pass
        elif plan.refusal is not None:
            outcome, why = plan.refusal, plan.why
        elif total:
            outcome, why = migration.DEADLINE, "the request's total timeout has passed"
        elif t is not None:
            t.compact()
            if t.ended:
                return self._finished(b, t)
            refused = migration.refusal_after(t)
            if refused is not None:
                outcome, why = refused
            elif self.migrations >= s.settings.max_migrations:
                outcome, why = migration.EXHAUSTED, f"it was continued {self.migrations} times already"
            else:
                await self._recount(t, plan)
                body = migration.continuation(plan, t.text, t.tokens)
                if body is None:
                    return self._finished(b, t)
                got = await self._continue(b, body, broke, what)
                if not isinstance(got, _Refused):
                    return got
                outcome, why = got
        if relay.answered():  # [DONE] went out: the client has the whole answer, so end its body cleanly
            log.info("upstream %s %s after [DONE] (request %s): %r", b.name, what,
                     self.out.request_id.decode("latin-1"), e)
            return relay.tail()
        log.warning("upstream %s %s mid-response (request %s): %r%s", b.name, what,
                    self.out.request_id.decode("latin-1"), e, f"; not continued: {why}" if why else "")
        status = 504 if total or outcome == migration.DEADLINE else 502
        if outcome is not None:
            s.metrics.migrations.labels(model, outcome).inc()
        if self.sse and not stalled:  # a client that reads nothing gets nothing more
            message = f"upstream {b.name} {what} mid-stream" + (f"; not continued on another replica: {why}" if why
                                                                 else "")
            await self.send({"type": "http.response.body", "more_body": True,
                             "body": errors.sse_error_event(message, status)})
        s.metrics.count(model, b.name, status)
        # Returning without the final body message makes the server drop the connection:
        # the client sees a truncated response, never a clean end.
        return None

    async def _recount(self, t: Transcript, plan: migration.Plan) -> None:
        """Counts of the relayed text and of the original prompt from another replica (tokencount.py)."""
        s = self.streams
        other = s.pool.other(self.out.model, self.tried)
        if other is not None:
            await recount(s.opener.upstream, other, s.upstream_key, self.deadline, self.out.model, t, plan)

    def _finished(self, b: Backend, t: Transcript) -> bytes:
        self.streams.metrics.migrations.labels(self.out.model, migration.FINISHED).inc()
        log.info("upstream %s broke after the answer was complete (request %s): closing the stream", b.name,
                 self.out.request_id.decode("latin-1"))
        return t.closing()

    async def _continue(self, b: Backend, body: bytes, broke: float,
                        what: str) -> tuple[Leg, ClientRelay] | _Refused:
        """Open the continuation; its leg and relay, or the outcome and why it could not be."""
        s, model, t = self.streams, self.out.model, self.transcript
        assert t is not None
        if not s.pool.has_other(model, self.tried):
            return _Refused(migration.NO_REPLICA, "no other replica of the model is in rotation")
        self.migrations += 1
        sent = asyncio.get_running_loop().time()
        try:
            leg = await s.opener.open(self.out, body, self.tried, sent, self.deadline)
        except OpenFailed as e:
            if e.status == 503:
                return _Refused(migration.NO_REPLICA, "no other replica could take it")
            if e.code == "request_timeout":
                return _Refused(migration.DEADLINE, "the request's total timeout has passed")
            return _Refused(migration.FAILED, f"the continuation failed: {e}")
        except Rejected:
            return _Refused(migration.BUSY, "every other replica is busy")
        if leg.conn.status != 200 or not is_sse(leg.conn.headers):
            s.opener.release(leg)
            return _Refused(migration.FAILED, f"the continuation was answered with status {leg.conn.status}")
        s.metrics.migrations.labels(model, migration.MIGRATED).inc()
        log.warning("upstream %s %s mid-stream (request %s): continuing on %s after %d tokens", b.name, what,
                    self.out.request_id.decode("latin-1"), leg.backend.name, t.tokens)

        def spliced() -> None:
            gap = asyncio.get_running_loop().time() - broke
            s.metrics.splice_gap.labels(model).observe(gap)
            s.metrics.splice_overhead.labels(model).observe(sent - broke)
            self._first()

        return leg, SpliceRelay(self.send, spliced, Splice(t), self.write)
