"""gateway/coalesce.py: a response head and the body written in the same loop step leave in one
write; a head alone leaves at the next loop turn; nothing ever changes order."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.coalesce import _HoldHead


class Recorder:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 0


def _hold() -> tuple[_HoldHead, Recorder]:
    rec = Recorder()
    t: Any = rec
    return _HoldHead(t, asyncio.get_running_loop()), rec


HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


async def test_head_and_body_in_one_step_are_one_write() -> None:
    hold, rec = _hold()
    hold.write(HEAD)
    hold.write(b"{}")
    assert rec.writes == [HEAD + b"{}"]
    await asyncio.sleep(0)
    assert rec.writes == [HEAD + b"{}"]  # the flush at the end of the step finds nothing left


async def test_a_head_alone_goes_out_at_the_next_loop_turn() -> None:
    hold, rec = _hold()
    hold.write(HEAD)
    assert rec.writes == []
    await asyncio.sleep(0)
    assert rec.writes == [HEAD]
    hold.write(b"chunk")  # a body chunk later is written as it comes
    assert rec.writes == [HEAD, b"chunk"]


async def test_close_writes_a_held_head_first_and_abort_drops_it() -> None:
    hold, rec = _hold()
    hold.write(HEAD)
    hold.close()
    assert rec.writes == [HEAD] and rec.closed
    hold2, rec2 = _hold()
    hold2.write(HEAD)
    hold2.abort()
    await asyncio.sleep(0)
    assert rec2.writes == [] and rec2.aborted


async def test_other_writes_pass_straight_through_and_the_rest_is_delegated() -> None:
    hold, rec = _hold()
    hold.write(b"5\r\nhello\r\n")
    assert rec.writes == [b"5\r\nhello\r\n"]
    assert hold.get_write_buffer_size() == 0


async def _app(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})


async def _closed_after(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, requests: list[float]) -> float:
    """Send a request at each of ``requests`` (seconds from now, each after the last answer); the
    seconds from the last answer until the server closed the idle connection."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    for at in requests:
        await asyncio.sleep(max(0.0, start + at - loop.time()))
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n{}")
    answered = loop.time()
    assert await reader.read() == b""  # EOF: the server closed it
    return loop.time() - answered


async def test_an_idle_connection_closes_a_keep_alive_timeout_after_its_last_answer() -> None:
    import uvicorn

    from gateway.coalesce import HttpToolsProtocol

    config = uvicorn.Config(_app, host="127.0.0.1", port=0, http=HttpToolsProtocol, lifespan="off",
                            timeout_keep_alive=0.3, log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve())
    try:
        for _ in range(500):  # uvicorn says it has started only through this flag
            if server.started:
                break
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        # One request; then four, the later ones while a timer armed at an earlier answer runs: the
        # close still comes a whole timeout after the last answer, neither before nor much after.
        for requests in ([0.0], [0.0, 0.1, 0.35, 0.6]):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            idle = await _closed_after(reader, writer, requests)
            # Not before the timeout; the upper bound only catches a connection never closed (a
            # loaded CI host may be slow to run the timer, so it is wide).
            assert 0.28 <= idle < 2.0, (requests, idle)
            writer.close()
    finally:
        server.should_exit = True
        await task
