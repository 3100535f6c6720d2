"""What a vLLM server receives from the twin benchmark's client, directly and through the gateway.

On GPUs, the gateway's side of a twin pass fell into a slow TTFT mode inside vLLM's API server more
often than the direct side (bench/gpu/results/twin-defaults-h200x2). This asks what differs on
the wire: a recording server stands in for vLLM, and the twin client's request (aiohttp, the body
of bench/gpu/window_client.py) goes to it straight and through the gateway. For each request it
prints how many reads the server's protocol took to receive it, its header names, and whether the
body arrived byte for byte.

    .venv/bin/python bench/compare/wire.py [--requests 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
from typing import Any

import aiohttp
from targets import ROOT, gateway

from tests.support.procs import free_port

BODY = {"model": "m", "prompt": "hello world " * 40, "max_tokens": 128, "ignore_eos": True, "temperature": 0.0,
        "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
_MODELS = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}, {"id": "paced", "object": "model"}]})
_EVENTS = [b'data: {"choices":[{"index":0,"text":"x"}]}\n\n'] * 3 + [b"data: [DONE]\n\n"]
_STREAM = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
           + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in _EVENTS) + b"0\r\n\r\n")


class Recorder(asyncio.Protocol):
    """An HTTP/1.1 server just good enough for the gateway's probes and a streamed completion;
    each POST's head, body and the sizes of the reads it came in are appended to ``posts``."""

    def __init__(self, posts: list[dict[str, Any]]) -> None:
        self.posts = posts
        self.buf = b""
        self.reads: list[int] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t: asyncio.Transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.reads.append(len(data))
        self.buf += data
        while b"\r\n\r\n" in self.buf:
            head, rest = self.buf.split(b"\r\n\r\n", 1)
            lines = head.split(b"\r\n")
            fields = [line.split(b":", 1) for line in lines[1:]]
            size = next((int(v) for k, v in fields if k.strip().lower() == b"content-length"), 0)
            if len(rest) < size:
                return
            body, self.buf = rest[:size], rest[size:]
            if lines[0].startswith(b"POST"):
                self.posts.append({"reads": self.reads, "headers": [k.strip().lower().decode() for k, _ in fields],
                                   "body": body})
                self.t.write(_STREAM)
            else:
                answer = _MODELS.encode() if b" /v1/models" in lines[0] else b""
                self.t.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(answer), answer))
            self.reads = []


def serve(port: int, posts: list[dict[str, Any]]) -> asyncio.AbstractEventLoop:
    """The recorder on its own loop in a daemon thread (the gateway probes it while this process
    waits); returns that loop."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(loop.create_server(lambda: Recorder(posts), "127.0.0.1", port))
        ready.set()
        loop.run_forever()

    threading.Thread(target=run, daemon=True).start()
    ready.wait(10)
    return loop


async def send(url: str, n: int) -> None:
    """``n`` streamed completions one after another on one kept-alive connection, as window_client.py's."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=False)) as http:
        for _ in range(n):
            async with http.post(url + "/v1/completions", json=BODY) as r:
                async for _ in r.content:
                    pass


def compare(requests: int) -> dict[str, list[dict[str, Any]]]:
    """The posts the recorder saw, straight from the client and through the gateway."""
    work = ROOT / "bench" / "results" / "compare-work"
    work.mkdir(parents=True, exist_ok=True)
    port, posts = free_port(), []
    loop = serve(port, posts)
    up = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(send(up, requests))
        direct = list(posts)
        gw, url, _ = gateway(work, up, 0, work)
        try:
            asyncio.run(send(url, requests))
        finally:
            gw.stop()
    finally:
        loop.call_soon_threadsafe(loop.stop)
    return {"direct": direct, "gateway": posts[len(direct):]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=3)
    a = ap.parse_args()
    seen = compare(a.requests)
    sent = json.dumps(BODY).encode()
    for path, posts in seen.items():
        for p in posts:
            print(f"{path}: {len(p['reads'])} read(s) of {p['reads']} bytes; body as sent: {p['body'] == sent}; "
                  f"headers: {', '.join(p['headers'])}")


if __name__ == "__main__":
    main()
