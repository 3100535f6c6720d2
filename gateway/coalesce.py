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
uvicorn's own transport.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _UvicornHttpTools

_HEAD = b"HTTP/1.1 "


class _HoldHead:
    __slots__ = ("_flush_at", "_head", "_loop", "_t")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._t = transport
        self._loop = loop
        self._head: bytes | None = None
        self._flush_at: asyncio.Handle | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        head = self._head
        if head is not None:
            self._head = None
            if self._flush_at is not None:
                self._flush_at.cancel()
            self._t.write(head + bytes(data))
        elif data[:9] == _HEAD:
            self._head = bytes(data)
            self._flush_at = self._loop.call_soon(self._flush)
        else:
            self._t.write(data)

    def _flush(self) -> None:
        head, self._head, self._flush_at = self._head, None, None
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


class HttpToolsProtocol(_UvicornHttpTools):
    """uvicorn's httptools protocol, writing a head and its immediate body together."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_HoldHead(transport, self.loop))  # type: ignore[arg-type]
