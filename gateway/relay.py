"""Relaying body chunks to the client from the upstream connection's parser callback.

An ASGI server's ``send`` for a body message is a coroutine that, while the client keeps up,
finishes without ever suspending (uvicorn: one ``transport.write``). Driving it in place with
``coro.send(None)`` from the upstream protocol's callback therefore writes the chunk at once, with
no task wake-up per chunk. When it does suspend (the client's socket buffer is full and the server
waits for it to drain), the half-run coroutine is kept, the upstream connection pauses reading,
and the request's task finishes it with ``drain()``, awaiting what the coroutine waits for, as a
task would. Nothing is assumed about the server beyond ASGI: any ``send`` works, at worst on the
slow path. Under the gateway's own protocol (coalesce.py) a relay also gets the server's chunk
write for its response, which frames and writes a chunk with neither the message dict nor the
coroutine; where that write declines (the client is slow or gone), the ``send`` takes the chunk.

A relay keeps the last chunk it sent: when the client disconnects, ``answered()`` says whether
that chunk ended with ``data: [DONE]``, the whole answer. Then the disconnect is not a cancel
(inbound.Flight): a client that closes at once, as the openai SDK does, before the upstream's
chunked terminator arrives, gets a 200 whose upstream connection goes back to the pool, not a 499
with the upstream thrown away. Keeping the chunk costs one store per chunk; looking at it costs
only on a disconnect.

Two variants serve streams that can continue on another replica (stream.py): ``StreamRelay`` sends
only whole SSE events and keeps what it sent in the stream's transcript (sse.py; an append per
chunk, no parsing), and ``SpliceRelay`` rewrites a continuation's events into the client's stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from starlette.types import Send

from gateway.sse import COMPACT_BYTES, Splice, Transcript, event_end

_Step = Coroutine[Any, Any, None]
# The server's own chunk write for this response (coalesce.BodyWrite): True when it wrote the
# chunk, False when the ASGI send must (not yet streaming, the client slow or gone).
Write = Callable[[bytes], bool]
_DONE = b"data: [DONE]\n\n"


class ClientRelay:
    """The sink for one response's body (connection.Sink), and its slow path."""

    __slots__ = ("_first", "_last", "_pending", "_send", "_write", "error", "on_first")

    def __init__(self, send: Send, on_first: Callable[[], None], write: Write | None = None) -> None:
        self._send = send
        self._write = write
        self._last = b""
        self._first = True
        self._pending: tuple[_Step, Any] | None = None
        self.error: BaseException | None = None  # raised by the server's send; re-raised by drain()
        self.on_first = on_first

    def __call__(self, chunk: bytes) -> bool:
        if self._first:
            self._first = False
            self.on_first()
        if self.error is not None:
            return False
        self._last = chunk
        write = self._write
        if write is not None and write(chunk):
            return True
        coro: _Step = self._send({"type": "http.response.body", "body": chunk, "more_body": True})  # type: ignore[assignment]
        try:
            yielded = coro.send(None)
        except StopIteration:
            return True
        except BaseException as e:  # never into the parser's callback: the task sees it in drain()
            self.error = e
            return False
        self._pending = (coro, yielded)
        return False

    def answered(self) -> bool:
        """The client has the whole answer: the last chunk sent ended the stream with ``[DONE]``."""
        return self._last.endswith(_DONE)

    @property
    def started(self) -> bool:
        """A body chunk was relayed."""
        return not self._first

    def tail(self) -> bytes:
        """Bytes held back for the final body message (none: every chunk went out as it came)."""
        return b""

    async def drain(self) -> None:
        """Finish the send that suspended, as the task that owns the request."""
        pending, self._pending = self._pending, None
        if pending is not None:
            coro, yielded = pending
            await _finish(coro, yielded)
        if self.error is not None:
            raise self.error


class StreamRelay(ClientRelay):
    """A stream that may continue elsewhere: whole events only, each chunk kept in the transcript.

    vLLM writes each event as one HTTP chunk, so a chunk nearly always ends an event and the check
    is one ``endswith``. One that does not (a large event split across reads) has its unfinished
    event held back until the rest arrives: if the replica died in between, the client would
    otherwise hold half an event that no continuation can complete. ClientRelay's send is repeated
    here rather than called: a call per chunk is a measurable share of this path (bench/relay)."""

    __slots__ = ("_kept", "_size", "_tail", "transcript")

    def __init__(self, send: Send, on_first: Callable[[], None], transcript: Transcript,
                 write: Write | None = None) -> None:
        super().__init__(send, on_first, write)
        self.transcript = transcript
        self._kept = transcript.kept
        self._size = 0  # bytes kept since the last compaction
        self._tail = b""

    def __call__(self, chunk: bytes) -> bool:
        if self._tail or not chunk.endswith(b"\n\n"):
            chunk = self._whole(chunk)
            if not chunk:
                return True
        self._kept.append(chunk)
        self._size += len(chunk)
        if self._size > COMPACT_BYTES:
            self._size = 0
            self.transcript.compact()
        if self._first:
            self._first = False
            self.on_first()
        if self.error is not None:
            return False
        self._last = chunk
        write = self._write
        if write is not None and write(chunk):
            return True
        coro: _Step = self._send({"type": "http.response.body", "body": chunk, "more_body": True})  # type: ignore[assignment]
        try:
            yielded = coro.send(None)
        except StopIteration:
            return True
        except BaseException as e:
            self.error = e
            return False
        self._pending = (coro, yielded)
        return False

    def _whole(self, chunk: bytes) -> bytes:
        """The complete events of what is held and ``chunk``; the rest is held."""
        if self._tail:
            chunk, self._tail = self._tail + chunk, b""
        end = len(chunk) if chunk.endswith(b"\n\n") else event_end(chunk)
        chunk, self._tail = chunk[:end], chunk[end:]
        return chunk

    def tail(self) -> bytes:
        """What is held back at a clean end (a body that did not end with a blank line)."""
        tail, self._tail = self._tail, b""
        return tail


class SpliceRelay(ClientRelay):
    """A continuation's chunks, rewritten into the client's stream (sse.Splice)."""

    __slots__ = ("splice",)

    def __init__(self, send: Send, on_first: Callable[[], None], splice: Splice, write: Write | None = None) -> None:
        super().__init__(send, on_first, write)
        self.splice = splice

    def __call__(self, chunk: bytes) -> bool:
        out = self.splice.feed(chunk)
        return ClientRelay.__call__(self, out) if out else self.error is None

    def tail(self) -> bytes:
        return self.splice.feed(b"\n\n") if self.splice.pending else b""


async def _finish(coro: _Step, yielded: Any) -> None:
    """Run ``coro`` to its end from where it suspended on ``yielded``, as asyncio's Task would."""
    while True:
        try:
            if yielded is None:
                await asyncio.sleep(0)  # a bare yield: give the loop one turn
            else:
                # As Task.__step does: the future is now ours to wait on (awaiting it while this flag is
                # still set raises "await wasn't used with future").
                yielded._asyncio_future_blocking = False
                await yielded
        except BaseException as e:
            try:
                yielded = coro.throw(e)
            except StopIteration:
                return
            continue
        try:
            yielded = coro.send(None)
        except StopIteration:
            return
