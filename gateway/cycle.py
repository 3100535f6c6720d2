"""A request's cycle under uvicorn's httptools protocol, with less work per request.

uvicorn's ``RequestResponseCycle`` and the protocol callbacks that make it are most of what the
server costs per request (bench/compare/server_path.py: the same requests through uvicorn's
protocol and the gateway's, in process). ``CycleProtocol`` keeps their behaviour and cuts work
that does not change it:

- no ``asyncio.Event`` per request: ``_Signal`` makes a future only when ``receive`` has to wait,
  which a request whose body came with its head never does;
- the server's default headers (``date``) joined once per change (uvicorn makes a new list every
  second), not re-listed and re-checked for every response;
- a body chunk framed and written in one step, its size line looked up, not formatted; a cycle
  with ``__slots__``, positional arguments;
- the scope made in one literal, the URL split with fewer lookups.

The bytes written, the ASGI messages, the errors raised and logged, keep-alive, pipelining,
``Expect: 100-continue``, flow control and disconnects are uvicorn's (0.54):
tests/gateway/test_cycle.py runs the same requests through both and compares. Where uvicorn would
do something this does not repeat (an access log, ``limit_concurrency``, a server header that
``send`` acts on, an upgrade), the request goes through uvicorn's own cycle instead. The parser's
callbacks after the head (body, message complete) and the task per request are uvicorn's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import httptools
from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE, STATUS_LINE
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _UvicornHttpTools

# Any, not httptools' stub: it types the URL's ``query`` as bytes, which is None when there is none
# (a compiled build, bench/compare/compiled.py, checks the declared type and fails on it).
_parse_url: Callable[[bytes], Any] = httptools.parse_url
_find_name = HEADER_RE.search
_find_value = HEADER_VALUE_RE.search
_500 = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"21"), (b"connection", b"close")]
# A chunk's size line for sizes below 4 KiB (a vLLM event is a few hundred bytes): concatenating a
# looked-up line costs about a third of formatting it (``b"%x\r\n%s\r\n" %``) per chunk.
SIZED_BELOW = 4096
SIZE_LINES = tuple(b"%x\r\n" % n for n in range(SIZED_BELOW))


def chunk_frame(body: bytes) -> bytes:
    """``body`` framed as one chunk of a chunked body (not empty: that frame ends the body)."""
    n = len(body)
    return (SIZE_LINES[n] if n < SIZED_BELOW else b"%x\r\n" % n) + body + b"\r\n"


def _nothing() -> None:
    pass


class _Signal:
    """The part of ``asyncio.Event`` a cycle and its protocol use (set, clear, wait), with the future made only
    when someone waits while it is clear."""

    __slots__ = ("_is_set", "_loop", "_waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._is_set = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._is_set = True
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)

    def clear(self) -> None:
        self._is_set = False

    async def wait(self) -> None:
        if self._is_set:
            return
        w = self._waiter
        if w is None:
            w = self._waiter = self._loop.create_future()
        await w


class Cycle:
    """uvicorn's ``RequestResponseCycle`` (the attributes its protocol and coalesce.BodyWrite read
    are the same), for a connection of ``CycleProtocol`` without an access log."""

    __slots__ = ("body", "chunked_encoding", "disconnected", "expected_content_length", "flow", "keep_alive",
                 "logger", "message_event", "more_body", "on_response", "proto", "response_complete",
                 "response_started", "scope", "transport", "waiting_for_100_continue")

    def __init__(self, proto: CycleProtocol, scope: Any, keep_alive: bool) -> None:
        self.proto = proto
        self.scope = scope
        self.transport = proto.transport
        self.flow = proto.flow
        self.logger = proto.logger
        self.message_event = _Signal(proto.loop)
        self.on_response: Callable[[], None] = proto.on_response_complete
        self.disconnected = False
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = proto.expect_100_continue
        self.body = bytearray()
        self.more_body = True
        self.response_started = False
        self.response_complete = False
        self.chunked_encoding: bool | None = None
        self.expected_content_length = 0

    async def run_asgi(self, app: Any) -> None:
        try:
            result = await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            self.logger.error("Exception in ASGI application\n", exc_info=exc)
            if not self.response_started:
                await self._send_500()
            else:
                self.transport.close()
        else:
            if result is not None:
                self.logger.error("ASGI callable should return None, but returned '%s'.", result)
                self.transport.close()
            elif not self.response_started and not self.disconnected:
                self.logger.error("ASGI callable returned without starting response.")
                await self._send_500()
            elif not self.response_complete and not self.disconnected:
                self.logger.error("ASGI callable returned without completing response.")
                self.transport.close()
        finally:
            self.on_response = _nothing

    async def _send_500(self) -> None:
        await self.send({"type": "http.response.start", "status": 500, "headers": _500})
        await self.send({"type": "http.response.body", "body": b"Internal Server Error", "more_body": False})

    async def send(self, message: Any) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        if not self.response_started:
            if message["type"] != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', but got '{message['type']}'.")
            self._start(message)
        elif not self.response_complete:
            if message["type"] != "http.response.body":
                raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{message['type']}'.")
            self._body(message.get("body", b""), message.get("more_body", False))
        else:
            raise RuntimeError(f"Unexpected ASGI message '{message['type']}' sent, after response already completed.")

    def _start(self, message: Any) -> None:
        self.response_started = True
        self.waiting_for_100_continue = False
        status = message["status"]
        content = [STATUS_LINE[status], self.proto.default_head()]
        has_close = False
        for name, value in message.get("headers", ()):
            if _find_name(name):
                raise RuntimeError("Invalid HTTP header name.")
            if _find_value(value):
                raise RuntimeError("Invalid HTTP header value.")
            name = name.lower()
            if name == b"content-length" and self.chunked_encoding is None:
                self.expected_content_length = int(value.decode())
                self.chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
            elif name == b"connection" and b"close" in [t.lower().strip() for t in value.split(b",")]:
                self.keep_alive = False
                has_close = True
            content += (name, b": ", value, b"\r\n")
        if not self.keep_alive and not has_close:
            content.append(b"connection: close\r\n")
        if self.chunked_encoding is None and self.scope["method"] != "HEAD" and status not in (204, 304):
            self.chunked_encoding = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        self.transport.write(b"".join(content))

    def _body(self, body: bytes, more_body: bool) -> None:
        if self.scope["method"] == "HEAD":
            self.expected_content_length = 0
        elif self.chunked_encoding:
            if more_body:
                if body:
                    self.transport.write(chunk_frame(body))
            else:
                self.transport.write(chunk_frame(body) + b"0\r\n\r\n" if body else b"0\r\n\r\n")
        else:
            if len(body) > self.expected_content_length:
                raise RuntimeError("Response content longer than Content-Length")
            self.expected_content_length -= len(body)
            self.transport.write(body)
        if not more_body:
            if self.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.message_event.set()
            if not self.keep_alive:
                self.transport.close()
            self.on_response()

    async def receive(self) -> Any:
        if self.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.waiting_for_100_continue = False
        if not self.disconnected and not self.response_complete:
            self.flow.resume_reading()
            await self.message_event.wait()
            self.message_event.clear()
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        message = {"type": "http.request", "body": bytes(self.body), "more_body": self.more_body}
        self.body = bytearray()
        return message


class CycleProtocol(_UvicornHttpTools):
    """uvicorn's httptools protocol making ``Cycle``s; uvicorn's own cycle where it logs access,
    limits concurrency or upgrades."""

    _default_list: object = None
    _default_head = b""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Headers uvicorn's send would act on, among the server's own: its cycle handles them.
        acted_on = {b"content-length", b"transfer-encoding", b"connection"}
        self._own_cycle = not (self.access_log or self.limit_concurrency is not None or any(
            name.lower() in acted_on for name, _ in self.config.encoded_headers))

    def default_head(self) -> bytes:
        """The server's default headers (``date``, ``server``) as written before a response's own."""
        headers = self.server_state.default_headers
        if headers is not self._default_list:  # uvicorn makes a new list when the date changes
            for name, value in headers:
                if _find_name(name) or _find_value(value):
                    raise RuntimeError("Invalid HTTP header.")  # pragma: no cover - uvicorn's own headers
            self._default_head = b"".join(b"%s: %s\r\n" % (name.lower(), value) for name, value in headers)
            self._default_list = headers
        return self._default_head

    def on_message_begin(self) -> None:
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self.scope = {  # type: ignore[typeddict-item]
            "type": "http", "asgi": {"version": self.asgi_version, "spec_version": "2.3"}, "http_version": "1.1",
            "server": self.server, "client": self.client, "scheme": self.scheme,  # type: ignore[typeddict-item]
            "root_path": self.root_path, "headers": self.headers, "state": self.app_state.copy(),
        }

    def on_headers_complete(self) -> None:
        if not self._own_cycle or self.parser.should_upgrade():
            super().on_headers_complete()  # uvicorn's cycle: it logs, answers 503, upgrades
            return
        parser, scope = self.parser, self.scope
        http_version = parser.get_http_version()
        scope["method"] = parser.get_method().decode("ascii")
        if http_version != "1.1":
            scope["http_version"] = http_version
        url = _parse_url(self.url)
        raw_path = url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = unquote(path)
        scope["path"] = self.root_path + path
        scope["raw_path"] = self.root_path.encode("ascii") + raw_path if self.root_path else raw_path
        scope["query_string"] = url.query or b""
        existing = self.cycle
        cycle = Cycle(self, scope, http_version != "1.0" and parser.should_keep_alive())
        self.cycle = cycle  # type: ignore[assignment]
        if existing is None or existing.response_complete:
            self._start_asgi_task(cycle, self.app)  # type: ignore[arg-type]
        else:  # pipelined: queued until the one before it is answered
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, self.app))  # type: ignore[arg-type]
