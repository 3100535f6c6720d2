"""coalesce.BodyWrite: the gateway's protocol's chunk write writes exactly what uvicorn's ``send``
writes for a body chunk, and only while that ``send`` would write at once; otherwise it declines and
``send`` keeps its part (waiting for a slow client, ignoring a gone one, refusing a completed
response). Driven through the real protocol with a recording transport, no sockets."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from gateway.coalesce import BODY_WRITE, BodyWrite, HttpToolsProtocol
from gateway.relay import ClientRelay

CHUNKS = [b"data: {\"a\":1}\n\n", b"data: {\"b\":22}\n\n", b"", b"data: [DONE]\n\n"]
App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


class Recorder:
    def __init__(self) -> None:
        self.data = bytearray()
        self.closing = False

    def write(self, data: bytes) -> None:
        self.data += data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _request(method: bytes = b"POST") -> bytes:
    return method + b" /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}"


def _connected(app: App) -> tuple[HttpToolsProtocol, Recorder]:
    """The gateway's protocol serving ``app`` on a connection whose writes ``Recorder`` keeps."""
    config = Config(app, lifespan="off", access_log=False, log_level="warning")
    config.load()
    proto = HttpToolsProtocol(config=config, server_state=ServerState(), app_state={},
                              _loop=asyncio.get_running_loop())
    rec = Recorder()
    t: Any = rec
    proto.connection_made(t)
    return proto, rec


async def _feed(proto: HttpToolsProtocol, *requests: bytes) -> None:
    proto.data_received(b"".join(requests))
    for _ in range(20):  # loop turns for the app's task to run to its end
        await asyncio.sleep(0)


async def _serve(app: App, *requests: bytes) -> tuple[HttpToolsProtocol, Recorder]:
    proto, rec = _connected(app)
    await _feed(proto, *requests)
    return proto, rec


def _streaming(use_write: bool) -> App:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        write = scope[BODY_WRITE](scope)
        for c in CHUNKS:
            if not (use_write and write is not None and write(c)):
                await send({"type": "http.response.body", "body": c, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    return app


async def test_the_same_bytes_as_send_for_a_whole_stream() -> None:
    _, by_send = await _serve(_streaming(False), _request())
    _, by_write = await _serve(_streaming(True), _request())
    assert b"transfer-encoding: chunked" in by_send.data
    assert by_write.data == by_send.data
    assert by_write.data.endswith(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")


@pytest.mark.parametrize("use_write", [False, True])
async def test_every_chunk_size_framed_as_http_says(use_write: bool) -> None:
    """Sizes on both sides of the size-line table's end (cycle.SIZE_LINES) and with hex letters,
    through the chunk write and through ``send``, against frames made here by the spec."""
    sizes = [1, 10, 255, 4095, 4096, 4097, 70000]
    chunks = [bytes([65 + i]) * n for i, n in enumerate(sizes)]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        write = scope[BODY_WRITE](scope)
        for c in chunks[:-1]:
            if not (use_write and write(c)):
                await send({"type": "http.response.body", "body": c, "more_body": True})
        await send({"type": "http.response.body", "body": chunks[-1], "more_body": False})

    _, rec = await _serve(app, _request())
    body = bytes(rec.data).split(b"\r\n\r\n", 1)[1]
    assert body == b"".join(format(len(c), "x").encode() + b"\r\n" + c + b"\r\n" for c in chunks) + b"0\r\n\r\n"


@pytest.mark.parametrize("method", [b"POST", b"HEAD"])
async def test_declines_where_send_would_not_frame_a_chunk(method: bytes) -> None:
    """Before the head, for a HEAD response (no body, no chunks), and for a sized body."""
    seen: list[tuple[str, bool]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        write = scope[BODY_WRITE](scope)
        assert isinstance(write, BodyWrite)
        seen.append(("before the head", write(b"x")))
        if scope["method"] == "HEAD":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            seen.append(("HEAD", write(b"x")))
        else:
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"1")]})
            seen.append(("sized", write(b"x")))
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else b"y"})
        seen.append(("after the end", write(b"x")))

    _, rec = await _serve(app, _request(method))
    assert seen and not any(ok for _, ok in seen), seen
    assert b"x" not in rec.data.split(b"\r\n\r\n", 1)[1]


async def test_declines_for_a_slow_or_gone_client_and_send_keeps_its_part() -> None:
    results: list[bool] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        write = scope[BODY_WRITE](scope)
        proto.pause_writing()  # the client's socket buffer is full
        results.append(write(b"slow"))
        proto.resume_writing()
        results.append(write(b"fast"))
        proto.connection_lost(None)  # the client went away
        results.append(write(b"gone"))
        await send({"type": "http.response.body", "body": b"gone", "more_body": True})  # ignored, as before

    proto, rec = _connected(app)
    await _feed(proto, _request())
    assert results == [False, True, False]
    body = rec.data.split(b"\r\n\r\n", 1)[1]
    assert body == b"4\r\nfast\r\n"


async def test_a_pipelined_request_not_yet_current_gets_none() -> None:
    got: list[object] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        got.append(scope[BODY_WRITE](scope))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    proto, _ = await _serve(app, _request(), _request())
    # The first request ran while the second's cycle was already the connection's current one.
    assert got[0] is None and isinstance(got[1], BodyWrite)
    assert proto.server_state.total_requests == 2


async def test_the_relay_writes_through_it_and_falls_back_to_send() -> None:
    sent: list[bytes] = []
    written: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message["body"])

    def write(chunk: bytes) -> bool:
        if chunk == b"declined":
            return False
        written.append(chunk)
        return True

    relay = ClientRelay(send, lambda: None, write)
    assert relay(b"a") and relay(b"declined") and relay(b"data: [DONE]\n\n")
    assert written == [b"a", b"data: [DONE]\n\n"] and sent == [b"declined"]
    assert relay.answered()
