"""One HTTP/1.1 connection to a backend: an asyncio Protocol around ``httptools.HttpResponseParser``.

Why not aiohttp: on the hot path aiohttp's StreamReader wakes the request's task for every chunk
(a future, a loop turn, a task step), and its request machinery costs more than the rest of the
gateway per request (bench/compare, profile_gateway.py). Here body chunks go from the parser
callback straight into a *sink* (relay.py: the client's ASGI ``send``, driven in place), and the
request's task wakes only for the response head, the end of the body, a failure, or a slow client.

Errors (the proxy's retry rule depends on which one)::

    UpstreamError
     ├── ConnectFailed        TCP/TLS connect refused, reset or timed out: nothing was sent
     ├── ResetBeforeResponse  the connection closed or failed before a whole response head arrived
     └── BrokenResponse       unparseable bytes, or closed in the middle of the body
    TimeoutError              headers, idle or total deadline (which one is the caller's to tell)

Flow control: when the sink reports the client as slow it keeps the chunk it was given, and this
connection stops reading (``pause_reading``); chunks already parsed from the last read wait in
``_held`` (at most one read's worth), and ``resume()`` after the client drained feeds them on.
So a slow client is never buffered for without bound.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import cast

import httptools


class UpstreamError(Exception):
    pass


class ConnectFailed(UpstreamError):
    pass


class ResetBeforeResponse(UpstreamError):
    pass


class BrokenResponse(UpstreamError):
    pass


# The sink takes every chunk it is given; False asks for no more until resume() (the client is slow).
Sink = Callable[[bytes], bool]


class UpstreamConnection(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop, on_lost: Callable[[UpstreamConnection], None]) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self._on_lost = on_lost
        self._parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.local: tuple[str, int] | None = None  # this end's address: accept_split.py finds the other end by it
        self.server = 0  # pid of the API server process serving it, 0 until read (upstream.py's pick)
        self._head_deadline: float | None = None  # while waiting for a head: when that wait times out
        self._head_timer: asyncio.TimerHandle | None = None  # outlives the wait it was armed for (_arm_head)
        self._head_at = 0.0  # when _head_timer fires
        self._reset()

    def _reset(self) -> None:
        self.busy = False  # a request is in flight: bytes are expected
        self.received = False  # a byte of the current response arrived
        self.status = 0  # set when the final (non-1xx) response head is complete
        self.headers: list[tuple[bytes, bytes]] = []
        self.complete = False
        self.keep_alive = False
        self.framed = False  # content-length or chunked; otherwise the close ends the body
        self.error: UpstreamError | None = None
        self.activity = 0  # body chunks so far: the idle check compares it, no clock read per chunk
        self._sink: Sink | None = None
        self._held: deque[bytes] = deque()
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None

    # --- the request's side -------------------------------------------------------------------

    def start(self, request: list[bytes]) -> None:
        """Send one request (its head and body, already framed)."""
        assert self.transport is not None and not self.busy
        self._reset()
        self.busy = True
        if len(request) == 1 or sum(map(len, request)) < 65536:
            self.transport.write(b"".join(request))  # one write, one syscall
        else:
            self.transport.writelines(request)  # a large body is not copied once more

    async def response_head(self, deadline: float) -> None:
        """Until the response head is in; raises UpstreamError or TimeoutError (at ``deadline``)."""
        if not self.status and self.error is None:
            self._arm_head(deadline)
            # _wait's steps, but no timer to cancel after: the head's timer outlives this wait.
            self._waiter = self.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = self._head_deadline = None
        if self.error is not None:
            raise self.error

    def attach(self, sink: Sink) -> None:
        """From now on body chunks go to ``sink``; those that came with the head go first."""
        self._sink = sink
        self._flush()

    def take_body(self) -> bytes:
        """What arrived before any sink was attached, all of it (for a response already complete)."""
        held, self._held = self._held, deque()
        return held[0] if len(held) == 1 else b"".join(held)

    async def body_end(self, idle_s: float, deadline: float) -> bool:
        """True once the whole body went to the sink; False when the sink asked to pause (finish the
        client's pending send, then call ``resume()``). Raises BrokenResponse, or TimeoutError when no
        chunk came for ``idle_s`` (detected up to a quarter of it, at most 1 s, late) or at ``deadline``."""
        if self.error is None and not self._paused and not self.complete:
            await self._wait(_IdleCheck(self, idle_s, min(1.0, idle_s / 4), deadline))
        if self.error is not None:
            raise self.error
        return not self._paused

    def resume(self) -> None:
        """The client drained: feed the held chunks, then read again."""
        self._paused = False
        self._flush()
        if not self._paused and self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed and not self._held and not self._paused

    def idle(self) -> None:
        """Back in the pool, between requests."""
        self.busy = False
        self._sink = None

    def abort(self) -> None:
        """Close now: a backend sees the request abandoned (vLLM aborts the generation)."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    async def _wait(self, timer: asyncio.TimerHandle | _IdleCheck) -> None:
        """Until ``_wake`` or ``_time_out``; ``timer`` (which times this wait out) is cancelled after."""
        self._waiter = self.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
            timer.cancel()

    def _arm_head(self, deadline: float) -> None:
        """Time the head's wait out at ``deadline``. A uvloop timer made and cancelled per request
        cost about 2 µs of the gateway's ~33 (bench/compare/request_path.py), so a live timer that
        fires no later than ``deadline`` is kept and re-armed for the rest when it fires
        (``_head_fired``): deadlines only move later (now + the headers timeout), so that is one
        timer per connection per headers timeout."""
        self._head_deadline = deadline
        if self._head_timer is not None:
            if self._head_at <= deadline:
                return
            self._head_timer.cancel()
        self._head_at = deadline
        self._head_timer = self.loop.call_at(deadline, self._head_fired)

    def _head_fired(self) -> None:
        self._head_timer = None
        deadline = self._head_deadline
        if deadline is None:
            return  # no wait for a head now: nothing to time out until the next one re-arms
        if deadline <= self._head_at:
            self._time_out()
        else:  # armed for an earlier request's deadline: on to this one's
            self._head_at = deadline
            self._head_timer = self.loop.call_at(deadline, self._head_fired)

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _time_out(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_exception(TimeoutError())

    def _flush(self) -> None:
        held, sink = self._held, self._sink
        while held and sink is not None and not self._paused:
            if not sink(held.popleft()):
                self._pause()

    def _pause(self) -> None:
        self._paused = True
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()
        self._wake()

    def _fail(self, error: UpstreamError) -> None:
        if self.error is None:
            self.error = error
        self._wake()

    # --- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass
        name = transport.get_extra_info("sockname")
        if isinstance(name, tuple):
            self.local = (name[0], name[1])

    def data_received(self, data: bytes) -> None:
        if not self.busy or self.complete:
            # Bytes nobody asked for: the stream is out of step, so the connection is unusable.
            self.abort()
            return
        self.received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(BrokenResponse(f"unparseable response: {e}"))
            self.abort()

    def eof_received(self) -> bool | None:
        return None  # let the transport close; connection_lost tells the rest

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._head_timer is not None:
            self._head_timer.cancel()  # a closed connection waits for nothing
            self._head_timer = None
        if self.busy and not self.complete and self.error is None:
            if self.status and not self.framed:
                self._message_complete()  # a body delimited by the close: this is its end
            else:
                why = f"{exc.__class__.__name__}: {exc}" if exc else "the backend closed the connection"
                self._fail(BrokenResponse(why) if self.status else ResetBeforeResponse(why))
        self._on_lost(self)

    # --- httptools callbacks ----------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))
        if len(name) in (14, 17) and name.lower() in (b"content-length", b"transfer-encoding"):
            self.framed = True

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status < 200:
            self.headers = []  # an interim response (100 Continue): the real one follows
            self.framed = False
            return
        self.status = status
        self.keep_alive = self._parser.should_keep_alive()
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.activity += 1
        if self._sink is not None and not self._paused and not self._held:
            if not self._sink(body):
                self._pause()
        else:
            self._held.append(body)

    def on_message_complete(self) -> None:
        if self.status:
            self._message_complete()

    def _message_complete(self) -> None:
        self.complete = True
        self._wake()


class _IdleCheck:
    """One timer per wait, not per chunk: every ``step`` it looks whether ``activity`` moved."""

    __slots__ = ("conn", "deadline", "handle", "idle_s", "quiet_since", "seen", "step")

    def __init__(self, conn: UpstreamConnection, idle_s: float, step: float, deadline: float) -> None:
        self.conn = conn
        self.idle_s = idle_s
        self.step = step
        self.deadline = deadline
        now = conn.loop.time()
        self.quiet_since = now
        self.seen = conn.activity
        self.handle = conn.loop.call_at(min(now + step, deadline), self.tick)

    def tick(self) -> None:
        conn = self.conn
        now = conn.loop.time()
        if conn.activity != self.seen:
            self.seen = conn.activity
            self.quiet_since = now
        if now >= self.deadline or now - self.quiet_since >= self.idle_s:
            conn._time_out()
            return
        self.handle = conn.loop.call_at(min(now + self.step, self.deadline), self.tick)

    def cancel(self) -> None:
        self.handle.cancel()
