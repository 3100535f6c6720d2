"""What an HTTP server of the gateway's own could save per request at most, in process.

docs/performance.md called "a server of its own under the proxy path" the one change left that
could bring the gateway's CPU per request to vllm-router's, with a ceiling of 0.94-1.09x, read from
``floor.py --raw``. That floor parses no header (its protocol defines no ``on_header``, so httptools
calls no Python per header), makes no scope and calls no app. A server that the proxy can run on
must do at least the first two. This measures, in server_path.py's harness (the same 64 connections,
requests, app and transport, no sockets), five servers around the same work per request (read the
body, wait one loop turn as the proxy waits for its upstream, answer a fixed JSON):

- ``uvicorn``: uvicorn's httptools protocol;
- ``gateway``: the gateway's (coalesce.py over cycle.py), as it ships;
- ``lean asgi``: the least an ASGI server on httptools does: each header's name lowered into the
  scope, a scope, ``receive`` and ``send``, a task per request, the head written with the body.
  No header checks, keep-alive timer, flow control, pipelining, 100-continue or error handling,
  which a real one needs: it is a lower bound on the cost of such a server;
- ``lean, no asgi``: the same without ASGI: the task gets the parsed request and answers through
  one call, as a proxy path written against the server itself would.
- ``raw head``: the same with no Python per header: the header block sliced from the read and the
  lines a proxy does not forward dropped by one regular expression.

The gateway's saving is its figure minus each lean one's: an upper bound on what the server could
give back. ``--compare`` adds it to a run of ``floor.py --router`` or ``run.py`` (the gateway's and
vllm-router's CPU per request in the same run) and prints the ratio that would leave.

    PYTHONPATH=. taskset -c 0 .venv/bin/python bench/compare/own_server.py [--rounds 20] [--compare 64,54]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import re
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httptools
import server_path as sp  # the harness: requests, app, transport (bench/compare is this script's path)
import uvloop
from uvicorn.protocols.http.httptools_impl import STATUS_LINE
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as UvicornProtocol

from gateway.app import YOUNG_GC_THRESHOLD
from gateway.coalesce import HttpToolsProtocol as GatewayProtocol


def _head(status: int, headers: list[tuple[bytes, bytes]]) -> list[bytes]:
    out = [STATUS_LINE[status]]
    for name, value in headers:
        out += (name, b": ", value, b"\r\n")
    out.append(b"\r\n")
    return out


def _answer() -> bytes:
    """The harness app's answer, made per request as a server would."""
    head = _head(200, sp.HEADERS)
    head.append(sp.ANSWER)
    return b"".join(head)


class _Lean(asyncio.Protocol):
    """Parses a request's head into a scope-shaped dict; the subclass decides what runs it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.parser = httptools.HttpRequestParser(self)
        self.transport: Any = None
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = b""
        self.more = True
        self.waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self.body = b""
        self.more = True

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.more = False
        w = self.waiter
        if w is not None:
            self.waiter = None
            w.set_result(None)

    def scope(self) -> dict[str, Any]:
        url = httptools.parse_url(self.url)
        return {"type": "http", "http_version": "1.1", "method": self.parser.get_method().decode("ascii"),
                "path": url.path.decode("ascii"), "raw_path": url.path, "query_string": url.query or b"",
                "headers": self.headers}

    async def body_complete(self) -> bytes:
        if self.more:
            w = self.waiter = self.loop.create_future()
            await w
        return self.body


class LeanAsgi(_Lean):
    """The least an ASGI server on httptools does per request."""

    def __init__(self, loop: asyncio.AbstractEventLoop, app: Callable[..., Awaitable[None]]) -> None:
        super().__init__(loop)
        self.app = app
        self._head: list[bytes] | None = None

    def on_headers_complete(self) -> None:
        self.loop.create_task(self.app(self.scope(), self.receive, self.send))

    async def receive(self) -> dict[str, Any]:
        return {"type": "http.request", "body": await self.body_complete(), "more_body": False}

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self._head = _head(message["status"], message["headers"])
            return
        head, self._head = self._head, None
        if head is not None:
            head.append(message.get("body", b""))
            self.transport.write(b"".join(head))
        else:
            self.transport.write(message.get("body", b""))


class LeanDirect(_Lean):
    """The same without ASGI: the request's task is the handler itself."""

    def on_headers_complete(self) -> None:
        self.loop.create_task(self.handle(self.scope()))

    async def handle(self, scope: dict[str, Any]) -> None:
        await self.body_complete()
        await asyncio.sleep(0)  # as sp.app: one loop turn, the proxy's wait for its upstream
        self.transport.write(_answer())


# The headers a proxy does not forward (inbound.HOP_BY_HOP and authorization), as one pattern over a
# head's header block: the per-header work of inbound.upstream_headers at C speed.
_HOP = re.compile(rb"(?im)^(?:connection|keep-alive|proxy-authenticate|proxy-authorization|te|trailer|"
                  rb"transfer-encoding|upgrade|host|content-length|x-request-id|date|server|authorization)"
                  rb":[^\r\n]*\r\n")


class _RawHead(_Lean):
    """Parses with no Python per header: httptools checks the head (with ``on_header`` None it
    calls no Python per header), and the header block is sliced from the bytes that brought it
    (one read, as every request of the harness and nearly every request of a client on loopback)."""

    on_header = None  # type: ignore[assignment]

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.data = b""
        super().__init__(loop)

    def data_received(self, data: bytes) -> None:
        self.data = data
        self.parser.feed_data(data)

    def on_headers_complete(self) -> None:
        data = self.data
        start = data.index(b"\r\n") + 2
        block = data[start:data.index(b"\r\n\r\n", start - 2) + 2]
        self.loop.create_task(self.handle(self.url, block))

    async def handle(self, url: bytes, block: bytes) -> None:
        _HOP.sub(b"", block)  # the block to forward
        httptools.parse_url(url)
        await self.body_complete()
        await asyncio.sleep(0)
        self.transport.write(_answer())


async def _lean_connection(make: Callable[[asyncio.AbstractEventLoop], _Lean], n: int) -> None:
    loop = asyncio.get_running_loop()
    proto = make(loop)
    t: Any = sp._Transport()
    proto.connection_made(t)
    for _ in range(n):
        t.done = loop.create_future()
        proto.data_received(sp.REQUEST)
        await t.done


async def main(requests: int, rounds: int) -> dict[str, list[float]]:
    config, state = sp.served()
    uvicorn_like: dict[str, type[UvicornProtocol]] = {"uvicorn": UvicornProtocol, "gateway": GatewayProtocol}
    lean: dict[str, Callable[[asyncio.AbstractEventLoop], _Lean]] = {
        "lean asgi": lambda loop: LeanAsgi(loop, sp.app), "lean, no asgi": LeanDirect, "raw head": _RawHead}
    each = max(1, requests // sp.CONC)

    def runs(name: str, n: int) -> Awaitable[Any]:
        if name in uvicorn_like:
            return asyncio.gather(*(sp._connection(uvicorn_like[name], config, state, n) for _ in range(sp.CONC)))
        return asyncio.gather(*(_lean_connection(lean[name], n) for _ in range(sp.CONC)))

    names = [*uvicorn_like, *lean]
    for name in names:  # warm-up
        await runs(name, 100)
    gc.freeze()
    gc.set_threshold(YOUNG_GC_THRESHOLD)  # as the gateway serves
    out: dict[str, list[float]] = {k: [] for k in names}
    for i in range(rounds):
        for name in names if i % 2 == 0 else names[::-1]:
            t0 = time.process_time()
            await runs(name, each)
            out[name].append((time.process_time() - t0) / (each * sp.CONC) * 1e6)
    return out


def report(res: dict[str, list[float]], compare: tuple[float, float] | None) -> None:
    med = {name: statistics.median(us) for name, us in res.items()}
    for name, us in res.items():
        q = statistics.quantiles(us, n=4)
        print(f"{name:14} CPU µs per request: median {med[name]:.2f} (quartiles {q[0]:.2f}–{q[2]:.2f})")
    for name in ("lean asgi", "lean, no asgi", "raw head"):
        # Per round, so that both figures come from the same moment of the run.
        saved = statistics.median(g - x for g, x in zip(res["gateway"], res[name], strict=True))
        line = f"gateway − {name}: {saved:.2f} µs per request at most"
        if compare is not None:
            gw, router = compare
            line += f"; {gw:g} − {saved:.2f} against vllm-router's {router:g}: {(gw - saved) / router:.3f}x at best"
        print(line)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=8000)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--compare", help="GATEWAY,ROUTER: their CPU µs per request in one end-to-end run")
    a = ap.parse_args()
    pair = tuple(float(x) for x in a.compare.split(",")) if a.compare else None
    if pair is not None and len(pair) != 2:
        ap.error("--compare takes two figures: GATEWAY,ROUTER")
    report(uvloop.run(main(a.requests, a.rounds)), pair)  # type: ignore[arg-type]
