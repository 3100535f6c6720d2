"""What uvicorn alone costs per request, the floor under any gateway served by it, beside the
gateway itself.

The floor: an ASGI app that reads the body and answers a fixed JSON itself (no upstream), served
the way the gateway is (uvloop, the gateway's httptools protocol, no access log). Each on CPU 0 in
turn, the gateway in front of run.py's fake upstream; the load generator (64 concurrent, as
run.py's conc phase) and the upstream on CPU 1. Prints user and system CPU µs per request of
every pass, then the medians. ``--granian`` adds the same answer served by granian, through ASGI
and through its own RSGI interface (bench/README.md: granian's floor). ``--raw`` adds the answer
made by an asyncio protocol of its own on httptools and uvloop, with no ASGI at all, and the same
with a task per request (what a proxy that awaits its upstream needs at least); neither reads a
header or runs an app. ``--lean`` adds own_server.py's ``lean, no asgi`` server (headers into a
scope, the body read, a task per request): the least a server the proxy could run on does, so the
most a gateway with its own HTTP server under the proxy path could save. ``--router`` adds vllm-router
0.1.17 in front of the same fake upstream, the baseline the saving is measured against.
``--python`` runs the uvicorn and raw floors and the gateway under another interpreter (a virtual
environment with the gateway's dependencies), as ab.py's ``--new-python``.

    .venv/bin/python bench/compare/floor.py [--passes 5] [--requests 20000] [--granian] [--raw] [--lean] [--router]
                                            [--python PY]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import loadgen
from run import PROXY_CPU, _run, side_upstream
from targets import ROOT, Proc, gateway, vllm_router

from tests.support.procs import free_port

_BODY = (b'{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant",'
         b'"content":"hi"},"finish_reason":"stop"}]}')
_HEAD = [(b"content-type", b"application/json"), (b"content-length", str(len(_BODY)).encode())]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": _HEAD})
    await send({"type": "http.response.body", "body": _BODY})


_RSGI_HEAD = [("content-type", "application/json")]


async def rsgi_app(scope: Any, protocol: Any) -> None:
    """The floor in granian's own interface (RSGI), its cheapest path: no ASGI messages."""
    await protocol()
    protocol.response_bytes(200, _RSGI_HEAD, _BODY)


def serve_granian(port: int, interface: str) -> None:
    """The same answer under granian (Rust HTTP/1.1, the app on an asyncio loop): whether another
    server's floor leaves more room for the gateway's own work (installed on demand: bench only)."""
    from granian import Granian

    target = "floor:app" if interface == "asgi" else "floor:rsgi_app"
    Granian(target, address="127.0.0.1", port=port, interface=interface, workers=1, runtime_threads=1,
            loop="uvloop", http="1", log_enabled=False, working_dir=Path(__file__).parent).serve()


_RAW_ANSWER = b"HTTP/1.1 200 OK\r\n" + b"".join(k + b": " + v + b"\r\n" for k, v in _HEAD) + b"\r\n" + _BODY


def serve_raw(port: int, per_request_task: bool) -> None:
    """The floor without ASGI: the request parsed by httptools in the protocol's callbacks and the
    answer written from them (keep-alive, as HTTP/1.1's default), or from a task made for each
    request, as a proxy that awaits its upstream would need."""
    import asyncio

    import httptools
    import uvloop

    class RawFloor(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: Any = transport
            self.parser = httptools.HttpRequestParser(self)

        def data_received(self, data: bytes) -> None:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError:
                self.transport.close()

        def on_message_complete(self) -> None:
            if per_request_task:
                asyncio.get_running_loop().create_task(self.answer())
            else:
                self.transport.write(_RAW_ANSWER)

        async def answer(self) -> None:
            self.transport.write(_RAW_ANSWER)

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(RawFloor, "127.0.0.1", port, backlog=2048)
        await server.serve_forever()

    uvloop.run(main())


def serve_lean(port: int) -> None:
    """The floor as own_server.py's ``lean, no asgi`` server answers it: each header's name lowered
    into a scope, a task per request that reads the body, waits one loop turn and answers."""
    import asyncio

    import uvloop
    from own_server import LeanDirect

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: LeanDirect(loop), "127.0.0.1", port, backlog=2048)
        await server.serve_forever()

    uvloop.run(main())


def serve(port: int) -> None:
    import uvicorn

    from gateway.coalesce import HttpToolsProtocol

    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http=HttpToolsProtocol, lifespan="off",
                access_log=False, log_level="warning", proxy_headers=False, server_header=False)


def start_floor(work: Path, server: str = "uvicorn", tree: Path = ROOT,
                python: str = sys.executable) -> tuple[Proc, str]:
    """The floor's app served from the tree at ``tree`` (this one by default), with its protocol,
    under ``python``."""
    port = free_port()
    p = Proc("floor", [python, str(tree / "bench" / "compare" / "floor.py"), "--serve", str(port),
                       "--server", server], work / "floor.log", PROXY_CPU, cwd=tree)
    url = f"http://127.0.0.1:{port}"
    p.wait_http(url + "/", 20, ok=lambda r: r.status_code == 200)
    return p, url


def one_pass(p: Proc, url: str, requests: int) -> tuple[tuple[float, float], loadgen.Result]:
    """Warm-up, then ``requests`` at 64 concurrent against ``url``: ``p``'s user and system µs per
    request, and the load's result. ``p`` is stopped after it, whatever happens."""
    try:
        _run(loadgen.requests(url, 2000, 64, 30))  # connections open, caches warm
        u0, s0 = p.cpu_split()
        r = _run(loadgen.requests(url, requests, 64, 60))
        u1, s1 = p.cpu_split()
    finally:
        p.stop()
    return ((u1 - u0) / r.done * 1e6, (s1 - s0) / r.done * 1e6), r


Measure = Callable[[Proc, str, int], tuple[tuple[float, float], loadgen.Result]]


def passes(starts: dict[str, Callable[[], tuple[Proc, str]]], n: int, requests: int,
           alternate: bool = False, measure: Measure = one_pass,
           unit: str = "request") -> dict[str, list[tuple[float, float]]]:
    """``n`` passes of every server that ``starts`` starts, one after another (the order reversed
    every other pass where ``alternate``): each one's user and system µs per ``unit`` (what
    ``measure`` divides by), printed as it goes, then the medians."""
    seen: dict[str, list[tuple[float, float]]] = {label: [] for label in starts}
    order = list(starts)
    for i in range(n):
        for label in order if not alternate or i % 2 == 0 else order[::-1]:
            (user, system), r = measure(*starts[label](), requests)
            seen[label].append((user, system))
            print(f"pass {i + 1}, {label}: {r.done} requests, {r.events} events, {r.errors} errors, "
                  f"user {user:.2f} µs, system {system:.2f} µs per {unit}", flush=True)
    for label, xs in seen.items():
        print(f"{label}: median user {statistics.median(u for u, _ in xs):.2f}, system "
              f"{statistics.median(s for _, s in xs):.2f}, all {statistics.median(u + s for u, s in xs):.2f} µs per "
              f"{unit} ({len(xs)} passes)")
    return seen


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--granian", action="store_true", help="also the floor under granian (pip installs it)")
    ap.add_argument("--raw", action="store_true", help="also the floor of an HTTP protocol of its own, no ASGI")
    ap.add_argument("--lean", action="store_true", help="also the floor of own_server.py's lean server (no ASGI)")
    ap.add_argument("--router", action="store_true", help="also vllm-router in front of the fake upstream")
    ap.add_argument("--python", default=sys.executable, help="runs the uvicorn and raw floors and the gateway")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--server", default="uvicorn", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        sys.path.insert(0, str(ROOT))
        if a.server == "uvicorn":
            serve(a.serve)
        elif a.server == "lean":
            serve_lean(a.serve)
        elif a.server.startswith("raw"):
            serve_raw(a.serve, per_request_task=a.server == "raw-task")
        else:
            serve_granian(a.serve, a.server.removeprefix("granian-"))
        return
    work, upstream, up_url = side_upstream()
    py = a.python
    starts: dict[str, Callable[[], tuple[Proc, str]]] = {
        "uvicorn floor": lambda: start_floor(work, python=py),
        "gateway": lambda: gateway(work, up_url, PROXY_CPU, work, launcher=(py, "-m", "gateway"))[:2]}
    if a.granian:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "granian==2.8.7"], check=True)
        starts["granian-asgi floor"] = lambda: start_floor(work, "granian-asgi")
        starts["granian-rsgi floor"] = lambda: start_floor(work, "granian-rsgi")
    if a.raw:
        starts["raw floor"] = lambda: start_floor(work, "raw", python=py)
        starts["raw floor, a task per request"] = lambda: start_floor(work, "raw-task", python=py)
    if a.lean:
        starts["lean floor"] = lambda: start_floor(work, "lean", python=py)
    if a.router:
        starts["vllm-router"] = lambda: vllm_router(work, up_url, PROXY_CPU, ROOT / "bench" / "results" / "venvs")[:2]
    try:
        passes(starts, a.passes, a.requests)
    finally:
        upstream.stop()


if __name__ == "__main__":
    main()
