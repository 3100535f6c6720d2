"""The HTTP server's own CPU per request, in process: uvicorn's httptools protocol against the
gateway's (gateway/coalesce.py over gateway/cycle.py), both around the same small ASGI app, in the
same run, alternated round by round.

No sockets and no load generator: each of 64 connections gets a transport that only records, and
its requests are fed to the protocol's ``data_received`` one after another (keep-alive), the next
when the answer's last byte was written. The app reads the body, waits one loop turn (as the proxy
waits for its upstream) and answers a fixed JSON with a content-length. What is measured is the
protocol's parsing, its cycle (scope, receive, send, the head's bytes) and the task per request:
the part of the gateway's cost per request that bench/compare/floor.py's ``uvicorn floor`` holds,
without the kernel's share, so steady enough to show a few µs.

    PYTHONPATH=. taskset -c 0 .venv/bin/python bench/compare/server_path.py [--requests 8000] [--rounds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from typing import Any

import uvloop
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as UvicornProtocol
from uvicorn.server import ServerState

from gateway.app import YOUNG_GC_THRESHOLD
from gateway.coalesce import HttpToolsProtocol as GatewayProtocol

BODY = b'{"model":"m","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16,"stream":false}'
REQUEST = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:8000\r\naccept: */*\r\n"
           b"accept-encoding: gzip, deflate\r\nuser-agent: Python/3.11 aiohttp/3.9\r\ncontent-length: %d\r\n"
           b"content-type: application/json\r\nauthorization: Bearer none\r\n\r\n%s") % (len(BODY), BODY)
ANSWER = (b'{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant",'
          b'"content":"hi"},"finish_reason":"stop"}]}')
HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(ANSWER))]
CONC = 64


class _Transport:
    """Records nothing; resolves ``done`` when a response's last byte (the JSON's brace) is written."""

    def __init__(self) -> None:
        self.done: asyncio.Future[None] | None = None

    def write(self, data: bytes) -> None:
        if data.endswith(b"}") and self.done is not None:
            self.done.set_result(None)
            self.done = None

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)


async def app(scope: Any, receive: Any, send: Any) -> None:
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await asyncio.sleep(0)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})


async def _connection(protocol: type[UvicornProtocol], config: Config, state: ServerState, n: int) -> None:
    loop = asyncio.get_running_loop()
    proto = protocol(config=config, server_state=state, app_state={}, _loop=loop)
    t: Any = _Transport()
    proto.connection_made(t)
    for _ in range(n):
        t.done = loop.create_future()
        proto.data_received(REQUEST)
        await t.done
    proto.connection_lost(None)


def served() -> tuple[Config, ServerState]:
    """The config and server state the protocols are made with, as the gateway is served."""
    config = Config(app, lifespan="off", access_log=False, log_level="warning", server_header=False,
                    proxy_headers=False)  # as gateway/main.py serves
    config.load()
    state = ServerState()
    state.default_headers = [(b"date", b"Fri, 27 Nov 2026 00:00:00 GMT")]  # as uvicorn's server sets it
    return config, state


async def main(requests: int, rounds: int) -> dict[str, list[float]]:
    config, state = served()
    protocols: dict[str, type[UvicornProtocol]] = {"uvicorn": UvicornProtocol, "gateway": GatewayProtocol}
    each = max(1, requests // CONC)
    for p in protocols.values():  # warm-up
        await asyncio.gather(*(_connection(p, config, state, 100) for _ in range(CONC)))
    gc.freeze()
    gc.set_threshold(YOUNG_GC_THRESHOLD)  # as the gateway serves
    out: dict[str, list[float]] = {k: [] for k in protocols}
    for _ in range(rounds):
        for name, p in protocols.items():
            t0 = time.process_time()
            await asyncio.gather(*(_connection(p, config, state, each) for _ in range(CONC)))
            out[name].append((time.process_time() - t0) / (each * CONC) * 1e6)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=8000)
    ap.add_argument("--rounds", type=int, default=30)
    a = ap.parse_args()
    res = uvloop.run(main(a.requests, a.rounds))
    for name, us in res.items():
        q = statistics.quantiles(us, n=4)
        print(f"{name:8} CPU µs per request: median {statistics.median(us):.1f} (quartiles {q[0]:.1f}–{q[2]:.1f})")
    ratios = [g / u for g, u in zip(res["gateway"], res["uvicorn"], strict=True)]
    q = statistics.quantiles(ratios, n=4)
    print(f"gateway ÷ uvicorn: median {statistics.median(ratios):.3f} (quartiles {q[0]:.3f}–{q[2]:.3f}), "
          f"below 1 in {sum(r < 1 for r in ratios)} of {len(ratios)} rounds")
