"""Relaying body chunks to the client from the upstream connection's parser callback.

An ASGI server's ``send`` for a body message is a coroutine that, while the client keeps up,
finishes without ever suspending (uvicorn: one ``transport.write``). Driving it in place with
``coro.send(None)`` from the upstream protocol's callback therefore writes the chunk at once, with
no task wake-up per chunk. When it does suspend (the client's socket buffer is full and the server
waits for it to drain), the half-run coroutine is kept, the upstream connection pauses reading,
and the request's task finishes it with ``drain()``, awaiting what the coroutine waits for, as a
task would. Nothing is assumed about the server beyond ASGI: any ``send`` works, at worst on the
slow path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from starlette.types import Send

_Step = Coroutine[Any, Any, None]


class ClientRelay:
    """The sink for one response's body (connection.Sink), and its slow path."""

    __slots__ = ("_first", "_pending", "_send", "error", "on_first")

    def __init__(self, send: Send, on_first: Callable[[], None]) -> None:
        self._send = send
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

    @property
    def started(self) -> bool:
        """A body chunk was relayed."""
        return not self._first

    async def drain(self) -> None:
        """Finish the send that suspended, as the task that owns the request."""
        pending, self._pending = self._pending, None
        if pending is not None:
            coro, yielded = pending
            await _finish(coro, yielded)
        if self.error is not None:
            raise self.error


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
