"""One write for a response's head and the body sent right after it.

uvicorn writes the status line and headers as soon as the app sends ``http.response.start``, and
the body as a write of its own: two ``send`` syscalls for every answer that is complete at once.
In the CPU benchmark's 64-concurrent phase (bench/compare, profile_gateway.py) the head's write
alone was 13 % of the gateway's CPU.

``HttpToolsProtocol`` below is uvicorn's, given a transport whose ``write`` holds a response head
until the end of the current loop step. A body write in the same step goes out with it, in one
syscall: the proxy sends a complete answer's head and body in one step. Otherwise the head goes
out alone at the next loop turn, for example a stream whose first chunk is still to come. Bytes
never change order: a held head is always written before anything written after it. Only *when* a
head goes out changes, by one loop turn at most. Everything else passes straight through to
uvicorn's own transport. The heads held in one loop step share one callback at its end (``_Heads``):
a uvloop ``call_soon`` and its cancel per response cost about 0.9 µs.

The protocol also keeps uvicorn's keep-alive timer across requests: uvicorn cancels it when a
request's bytes arrive and makes a new one when its response ends, a libuv timer made, started,
stopped and closed per request (about 1.7 µs). Here the timer stays; the connection is marked busy
or idle since a time, and the timer, when it fires, closes the connection if it has been idle for
the whole keep-alive timeout and otherwise waits out the rest: the same close, at the same moment.

And it offers the app a cheaper way to send a streamed body (``BODY_WRITE`` in the scope): the
relay (relay.py) hands each chunk to ``BodyWrite``, which frames it as uvicorn's chunked send does
and writes it, without the message dict, the ``send`` coroutine and its checks (a relayed chunk
1.28 µs through ``send``, 0.60 µs this way: bench/relay/cost.py). It writes only while uvicorn's send would
write at once (a chunked response started and not complete, the client connected and not slow);
otherwise it declines and the app's ``send`` takes the chunk, waits for the client, or raises, as
before. Bytes and their order are those of ``send``: a declined chunk paused the upstream, and no
chunk is written until that ``send`` finished.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from gateway.cycle import SIZE_LINES, SIZED_BELOW, Cycle, CycleProtocol

_HEAD = b"HTTP/1.1 "
# The scope's key for the connection's BodyWrite factory: scope[BODY_WRITE](scope) is the chunk
# write of that scope's response, or None (a pipelined request not yet current).
BODY_WRITE = "fleet.body_write"


class _Heads:
    """The connections of one loop that hold a head; one callback writes those still held."""

    __slots__ = ("_held", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._held: list[_HoldHead] = []

    def hold(self, t: _HoldHead) -> None:
        if not self._held:
            # Runs after the step that holds this head (and after any other step already queued,
            # whose heads it flushes too: each still after its own step).
            self._loop.call_soon(self._flush)
        self._held.append(t)

    def _flush(self) -> None:
        held, self._held = self._held, []
        for t in held:
            t._flush()  # a head that went out with its body is None by now: nothing to write


_HEADS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Heads] = weakref.WeakKeyDictionary()


class _HoldHead:
    __slots__ = ("_head", "_heads", "_t")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._t = transport
        heads = _HEADS.get(loop)
        if heads is None:
            heads = _HEADS[loop] = _Heads(loop)
        self._heads = heads
        self._head: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._t.write(head + bytes(data))
        elif data[:9] == _HEAD:
            self._head = bytes(data)
            self._heads.hold(self)
        else:
            self._t.write(data)

    def _flush(self) -> None:
        head, self._head = self._head, None
        if head is not None and not self._t.is_closing():
            self._t.write(head)

    def close(self) -> None:
        self._flush()
        self._t.close()

    def abort(self) -> None:
        self._head = None
        self._t.abort()

    def is_closing(self) -> bool:
        return self._t.is_closing()

    def pause_reading(self) -> None:
        self._t.pause_reading()

    def resume_reading(self) -> None:
        self._t.resume_reading()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._t.get_extra_info(name, default)

    def __getattr__(self, name: str) -> Any:  # the rest of the transport's interface, rarely used
        return getattr(self._t, name)


class BodyWrite:
    """One response's chunk write: the bytes uvicorn's ``send`` of a body message with more to come
    writes, where that ``send`` would write at once. False: not written, ``send`` it instead."""

    __slots__ = ("_cycle",)

    def __init__(self, cycle: Cycle | RequestResponseCycle) -> None:
        self._cycle = cycle

    def __call__(self, chunk: bytes) -> bool:
        c = self._cycle
        # chunked_encoding is True only once a chunked head went out (never for HEAD, 204, 304).
        if c.chunked_encoding is not True or c.response_complete or c.disconnected or c.flow.write_paused:
            return False
        if chunk:  # as send: an empty chunk writes nothing (its framing would end the body)
            n = len(chunk)
            frame = (SIZE_LINES[n] if n < SIZED_BELOW else b"%x\r\n" % n) + chunk + b"\r\n"  # chunk_frame, inlined
            t: Any = c.transport  # the protocol's _HoldHead (typed as uvicorn's transport)
            if type(t) is _HoldHead and t._head is None:
                t._t.write(frame)  # no head held: straight to uvicorn's transport, one call fewer
            else:
                t.write(frame)
        return True


class HttpToolsProtocol(CycleProtocol):
    """uvicorn's httptools protocol with a lighter cycle (cycle.py), writing a head and its immediate
    body together, with one keep-alive timer per connection instead of one per request, and a chunk
    write of its own for streamed bodies."""

    _idle_since: float | None = None  # loop time the last response ended; None while a request is on

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_HoldHead(transport, self.loop))  # type: ignore[arg-type]
        self._body_write = self.body_write  # one bound method per connection, not one per request

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope[BODY_WRITE] = self._body_write  # type: ignore[literal-required]

    def body_write(self, scope: dict[str, Any]) -> BodyWrite | None:
        """The chunk write of ``scope``'s response, while its cycle is the connection's current one."""
        cycle = self.cycle
        return BodyWrite(cycle) if cycle is not None and cycle.scope is scope else None

    def _unset_keepalive_if_required(self) -> None:
        # uvicorn's cancels the timer (at a request's first bytes, at a response's end); here the
        # connection is only marked busy and the timer, if any, stays for _keep_alive_check.
        self._idle_since = None

    def on_response_complete(self) -> None:
        # uvicorn's (0.54), but for the keep-alive timer: armed only where none is running.
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._idle_since = None
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self._idle_since = self.loop.time()
            if self.timeout_keep_alive_task is None:
                self.timeout_keep_alive_task = self.loop.call_later(self._keep_alive_s(), self._keep_alive_check)

    def _keep_alive_s(self) -> float:
        # uvicorn declares the setting int and takes a float too; read untyped, so that a build
        # compiled with mypyc (which checks declared types) takes both.
        return getattr(self, "timeout_keep_alive")  # type: ignore[no-any-return]  # noqa: B009

    def _keep_alive_check(self) -> None:
        self.timeout_keep_alive_task = None
        since = self._idle_since
        if since is None:
            return  # a request is on: its response's end arms the timer again
        left = since + self._keep_alive_s() - self.loop.time()
        if left > 0:  # it went idle again after the timer was armed: wait out the rest
            self.timeout_keep_alive_task = self.loop.call_later(left, self._keep_alive_check)
        else:
            self.timeout_keep_alive_handler()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()  # as uvicorn's does (it did only where exc is None)
            self.timeout_keep_alive_task = None
