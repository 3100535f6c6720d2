"""cycle.CycleProtocol against uvicorn's own httptools protocol: the same requests fed to both, the
same apps behind them, and the same bytes written, in the same writes, the same ASGI messages and
scopes seen by the app, the same errors logged and the same connection state after. No sockets: a
recording transport, steps driven by hand (data, lost connection, loop turns)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as UvicornProtocol
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle
from uvicorn.server import ServerState

from gateway.cycle import Cycle, CycleProtocol
from tests.gateway.test_body_write import Recorder as BodyWriteRecorder

App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
DATE = [(b"date", b"Fri, 27 Nov 2026 00:00:00 GMT")]


class Recorder(BodyWriteRecorder):
    """test_body_write's transport, keeping each write apart."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        if data:  # uvicorn writes b"" for an empty chunk, which sends nothing
            self.writes.append(bytes(data))


class _Logged(logging.Handler):
    """What uvicorn's error logger says (it does not propagate to pytest's caplog)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()} {record.exc_info and record.exc_info[1]!r}")


Step = bytes | str  # bytes: fed to data_received; "lost": the connection drops; "turns": loop turns


def _connected(protocol: type[UvicornProtocol], app: App,
               **config: Any) -> tuple[UvicornProtocol, Recorder, ServerState]:
    """``protocol`` serving ``app`` on a connection whose writes ``Recorder`` keeps."""
    cfg = Config(app, lifespan="off", proxy_headers=False, **{"access_log": False, "log_level": "warning", **config})
    cfg.load()
    state = ServerState()
    state.default_headers = DATE + cfg.encoded_headers  # as uvicorn's server sets them
    proto = protocol(config=cfg, server_state=state, app_state={}, _loop=asyncio.get_running_loop())
    rec = Recorder()
    t: Any = rec
    proto.connection_made(t)
    return proto, rec, state


async def _run(protocol: type[UvicornProtocol], make_app: Callable[[list[Any]], App], steps: list[Step],
               **config: Any) -> dict[str, Any]:
    seen: list[Any] = []
    proto, rec, state = _connected(protocol, make_app(seen), **config)
    logged = _Logged()
    logging.getLogger("uvicorn.error").addHandler(logged)
    pending = []  # tasks the server's shutdown waits for, after each step
    for step in [*steps, "turns"]:
        if step == "lost":
            proto.connection_lost(None)
        elif step == "turns":
            for _ in range(30):
                await asyncio.sleep(0)
        else:
            assert isinstance(step, bytes)
            proto.data_received(step)
        pending.append(len(state.tasks))
    for task in list(state.tasks):
        task.cancel()
    await asyncio.sleep(0)
    logging.getLogger("uvicorn.error").removeHandler(logged)
    return {"writes": rec.writes, "closing": rec.closing, "seen": seen, "requests": state.total_requests,
            "pending": pending, "logged": logged.lines, "keep_alive": proto.timeout_keep_alive_task is not None}


async def _both(make_app: Callable[[list[Any]], App], steps: list[Step], **config: Any) -> dict[str, Any]:
    theirs = await _run(UvicornProtocol, make_app, steps, **config)
    ours = await _run(CycleProtocol, make_app, steps, **config)
    assert ours == theirs
    return ours


def _req(method: bytes = b"POST", path: bytes = b"/v1/completions", body: bytes = b"{}",
         extra: bytes = b"", version: bytes = b"1.1") -> bytes:
    return (method + b" " + path + b" HTTP/" + version + b"\r\nHost: x\r\nContent-Length: %d\r\n" % len(body)
            + extra + b"\r\n" + body)


def answering(status: int = 200, headers: list[tuple[bytes, bytes]] | None = None,
              bodies: tuple[bytes, ...] = (b"hello",), wait_end: bool = False) -> Callable[[list[Any]], App]:
    """An app that reads the whole request, records its scope and messages, and answers."""
    def make(seen: list[Any]) -> App:
        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            seen.append({k: v for k, v in scope.items() if k != "state"})
            more = True
            while more:
                m = await receive()
                seen.append(m)
                more = m.get("more_body", False)
            await send({"type": "http.response.start", "status": status,
                        "headers": headers if headers is not None else [(b"content-type", b"text/plain")]})
            for i, b in enumerate(bodies):
                await send({"type": "http.response.body", "body": b, "more_body": i < len(bodies) - 1})
            if wait_end:
                seen.append(await receive())  # after the response: disconnect
        return app
    return make


LENGTH = [(b"Content-Type", b"application/json"), (b"content-length", b"5")]


@pytest.mark.parametrize("name,make_app,steps", [
    ("content-length", answering(headers=LENGTH), [_req()]),
    ("chunked stream", answering(bodies=(b"a", b"", b"bcd", b"")), [_req()]),
    ("HEAD", answering(headers=LENGTH, bodies=(b"",)), [_req(b"HEAD", body=b"")]),
    ("204", answering(204, headers=[], bodies=(b"",)), [_req()]),
    ("HTTP/1.0", answering(), [_req(version=b"1.0")]),
    ("connection: close", answering(headers=[(b"Connection", b"keep-alive, Close")]), [_req()]),
    ("path, query", answering(), [_req(path=b"/v1/a%20b/c?x=1&y=%20")]),
    ("pipelined", answering(headers=LENGTH), [_req() + _req(body=b"[1]") + _req(b"GET", body=b"")]),
    ("body in parts", answering(), [_req(body=b"0123456789")[:-6], b"4567", b"89"]),
    ("chunked request", answering(),
     [b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n", "turns", b"0\r\n\r\n"]),
    ("100-continue", answering(), [_req(body=b"", extra=b"Expect: 100-continue\r\n")[:-2] + b"\r\n", "turns"]),
    ("100-continue, body", answering(),
     [_req(body=b"xy", extra=b"Expect: 100-Continue\r\n")[:-2], "turns", b"xy"]),
    ("receive after the answer", answering(wait_end=True), [_req()]),
    ("lost mid-body", answering(), [_req(body=b"0123456789")[:-4], "turns", "lost"]),
    ("lost after the answer", answering(wait_end=True), [_req(), "turns", "lost"]),
    ("bad request", answering(), [b"NOT HTTP\r\n\r\n"]),
])
async def test_the_same_as_uvicorns(name: str, make_app: Callable[[list[Any]], App], steps: list[Step]) -> None:
    out = await _both(make_app, steps)
    assert out["writes"] or name == "lost mid-body"


def failing(where: str) -> Callable[[list[Any]], App]:
    def make(seen: list[Any]) -> App:
        async def app(scope: dict[str, Any], receive: Any, send: Any) -> Any:
            seen.append(await receive())
            if where == "before start":
                raise ValueError("boom")
            if where == "no start":
                return None
            if where == "returns a value":
                return 1
            if where == "bad header":
                await send({"type": "http.response.start", "status": 200, "headers": [(b"x", b"a\nb")]})
            if where == "wrong first message":
                await send({"type": "http.response.body", "body": b"x"})
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"3")]})
            if where == "after start":
                raise ValueError("boom")
            if where == "too long":
                await send({"type": "http.response.body", "body": b"abcd"})
            if where == "too short":
                await send({"type": "http.response.body", "body": b"ab"})
            if where == "no end":
                await send({"type": "http.response.body", "body": b"ab", "more_body": True})
                return None
            await send({"type": "http.response.body", "body": b"abc"})
            if where == "after the end":
                await send({"type": "http.response.body", "body": b""})
            return None
        return app
    return make


@pytest.mark.parametrize("where", ["before start", "no start", "returns a value", "bad header", "wrong first message",
                                   "after start", "too long", "too short", "no end", "after the end"])
async def test_app_errors_are_answered_and_logged_as_uvicorn_does(where: str) -> None:
    out = await _both(failing(where), [_req()])
    assert out["logged"]


async def test_the_servers_own_headers_and_a_new_date() -> None:
    out = await _both(answering(headers=LENGTH), [_req()], headers=[("X-Node", "a")], server_header=True)
    assert b"server: uvicorn\r\n" in out["writes"][0] and b"x-node: a\r\n" in out["writes"][0]

    proto, rec, state = _connected(CycleProtocol, answering(headers=LENGTH)([]))
    proto.data_received(_req())
    await asyncio.sleep(0.01)
    state.default_headers = [(b"date", b"Fri, 27 Nov 2026 00:00:01 GMT")]  # uvicorn's next second
    proto.data_received(_req())
    await asyncio.sleep(0.01)
    assert [w.count(b"date: Fri, 27 Nov 2026 00:00:0") for w in rec.writes] == [1, 0, 1, 0]
    assert b"00:00:01 GMT" in rec.writes[2]


@pytest.mark.parametrize("config", [{"access_log": True}, {"limit_concurrency": 1},
                                    {"headers": [("Connection", "close")]}])
async def test_uvicorns_cycle_where_it_does_more(config: dict[str, Any]) -> None:
    """An access log, a concurrency limit or a server header that send acts on: uvicorn's cycle."""
    proto = _connected(CycleProtocol, answering()([]), **config)[0]
    proto.data_received(_req())
    assert type(proto.cycle) is RequestResponseCycle
    proto = _connected(CycleProtocol, answering()([]))[0]
    proto.data_received(_req())
    assert type(proto.cycle) is Cycle
