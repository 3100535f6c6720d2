"""The gateway's own CPU per non-streamed request, in process: no server, no sockets, no load
generator, so nothing but the request path is measured and one run is steady to about ±1 µs
(bench/compare/run.py's end-to-end figure moves by more than that from run to run on this VM).

The real app (gateway.main.build, the same config as run.py's) gets ASGI ``receive``/``send``
callables shaped like uvicorn's (the body at once, then an Event until the response is complete),
and its upstream connections get a fake transport that answers each request on the next loop
turn with a canned 200 (what bench/compare/upstream.py sends), through the real parser. 64
requests at a time, as run.py's ``conc`` phase; CPU time of this process per request, each round.

    PYTHONPATH=. .venv/bin/python bench/compare/request_path.py [--requests 64000] [--rounds 5]
    ... --floor   # the same callables around an app that answers by itself: the harness's own cost
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

import gateway.upstream
from gateway.connection import UpstreamConnection
from gateway.main import build
from gateway.state import BackendState
from gateway.upstream import Origin, UpstreamPool

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16,
                   "stream": False}).encode()
ANSWER = json.dumps({"id": "chatcmpl-bench0123456789abcdef", "object": "chat.completion", "created": 0,
                     "model": "m", "choices": [{"index": 0, "logprobs": None, "finish_reason": "length",
                                                "message": {"role": "assistant", "content": " tok" * 16}}],
                     "usage": {"prompt_tokens": 5, "completion_tokens": 16, "total_tokens": 21}},
                    separators=(",", ":")).encode()
RESPONSE = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
    len(ANSWER), ANSWER)
SCOPE: dict[str, Any] = {
    "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
    "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
    "headers": [(b"host", b"127.0.0.1:8000"), (b"accept", b"*/*"), (b"accept-encoding", b"gzip, deflate"),
                (b"user-agent", b"Python/3.11 aiohttp/3.9"), (b"content-length", str(len(BODY)).encode()),
                (b"content-type", b"application/json"), (b"authorization", b"Bearer none")],
    "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000)}


class _Transport:
    """Answers every write with RESPONSE on the next loop turn."""

    def __init__(self, loop: asyncio.AbstractEventLoop, conn: UpstreamConnection) -> None:
        self.loop, self.conn = loop, conn

    def write(self, _: bytes) -> None:
        self.loop.call_soon(self.conn.data_received, RESPONSE)

    def writelines(self, _: list[bytes]) -> None:
        self.write(b"")

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, _: str, default: Any = None) -> Any:
        return default  # no socket: the connection records no local address

    def abort(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _connect(_: UpstreamPool, origin: Origin) -> UpstreamConnection:
    loop = asyncio.get_running_loop()
    conn = UpstreamConnection(loop, lambda c: None)
    conn.connection_made(_Transport(loop, conn))  # type: ignore[arg-type]
    origin.add(conn)
    return conn


async def _request(app: Any) -> None:
    complete = asyncio.Event()
    read = False

    async def receive() -> dict[str, Any]:
        nonlocal read
        if not read:
            read = True
            return {"type": "http.request", "body": BODY, "more_body": False}
        if not complete.is_set():
            await complete.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            complete.set()

    await app(dict(SCOPE), receive, send)


async def _floor(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await asyncio.sleep(0)  # the turn the upstream's answer takes
    await send({"type": "http.response.body", "body": ANSWER, "more_body": False})


async def main(requests: int, rounds: int, floor: bool) -> list[float]:
    gateway.upstream.UpstreamPool._connect = _connect  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "gateway.json"
        cfg.write_text(json.dumps({"backend": "vllm", "served_models": ["m", "paced"], "vllm_instances": [
            {"host": "http://127.0.0.1:9", "models": ["m", "paced"], "name": "up"}]}))
        gw = build(str(cfg))
    for b in gw.pool.backends:
        b.state = BackendState.HEALTHY  # as the first probe would
    app: Any = _floor if floor else gw
    gc.freeze()  # as the app's lifespan does
    conc = 64
    each = max(1, requests // conc)

    async def worker(n: int) -> None:
        for _ in range(n):
            await _request(app)

    await asyncio.gather(*(worker(200) for _ in range(conc)))  # warm-up: connections, label children
    out = []
    for _ in range(rounds):
        t0 = time.process_time()
        await asyncio.gather(*(worker(each) for _ in range(conc)))
        out.append((time.process_time() - t0) / (each * conc) * 1e6)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=64000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--floor", action="store_true")
    a = ap.parse_args()
    us = uvloop.run(main(a.requests, a.rounds, a.floor))
    print("CPU µs per request:", " ".join(f"{x:.2f}" for x in us), f"median {statistics.median(us):.2f}")
