"""A fast fake vLLM for the benchmark: raw asyncio + uvloop HTTP/1.1, keep-alive, one process.

Answers what the proxies under test need: GET /health (200, empty, as vLLM), GET /v1/models,
GET /metrics (vLLM's load gauges), and POST /v1/chat/completions and /v1/completions, either a
JSON body (Content-Length) or SSE in chunked encoding, shaped like vLLM's ``chat.completion.chunk``.

Pacing is chosen by model name, so that every proxy (LiteLLM re-encodes bodies) passes it on:
a model called ``paced`` gets its first token at once and the next ones at ``--token-ms``
intervals on an absolute schedule (no drift); any other model gets its tokens back to back.
Events are prebuilt bytes: the server must never be the bottleneck (compare the "direct" row).

    python bench/compare/upstream.py --port 9000 [--token-ms 20]
    python bench/compare/upstream.py --port 9000 --shared 2   # two processes on one listening socket
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import socket
import subprocess
import sys
import time

MODELS = ("m", "paced")
CHUNK_END = b"0\r\n\r\n"


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(model: str, obj: str, delta: dict[str, object], finish: str | None) -> bytes:
    choice: dict[str, object] = {"index": 0, **delta, "logprobs": None, "finish_reason": finish}
    doc = {"id": "chatcmpl-bench0123456789abcdef", "object": obj, "created": 1700000000, "model": model,
           "choices": [choice]}
    return _chunked(b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n")


def _prebuilt() -> dict[tuple[str, bool], tuple[bytes, bytes, bytes]]:
    """(model, chat) -> (token event, final event, done) as ready chunked frames."""
    out = {}
    for m in MODELS:
        for chat in (True, False):
            obj = "chat.completion.chunk" if chat else "text_completion"
            tok: dict[str, object] = {"delta": {"content": " tok"}} if chat else {"text": " tok"}
            end: dict[str, object] = {"delta": {}} if chat else {"text": ""}
            out[(m, chat)] = (_event(m, obj, tok, None), _event(m, obj, end, "length"), _chunked(b"data: [DONE]\n\n"))
    return out


EVENTS = _prebuilt()
SSE_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
            b"transfer-encoding: chunked\r\n\r\n")


def _response(status: str, body: bytes, ctype: bytes = b"application/json") -> bytes:
    return (b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n" % (status.encode(), ctype, len(body))
            + body)


def _completion(model: str, chat: bool, n: int) -> bytes:
    text = " tok" * n
    choice: dict[str, object] = {"index": 0, "logprobs": None, "finish_reason": "length"}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    doc = {"id": "chatcmpl-bench0123456789abcdef", "object": "chat.completion" if chat else "text_completion",
           "created": int(time.time()), "model": model, "choices": [choice],
           "usage": {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5}}
    return _response("200 OK", json.dumps(doc, separators=(",", ":")).encode())


MODELS_BODY = json.dumps({"object": "list", "data": [
    {"id": m, "object": "model", "created": 0, "owned_by": "vllm", "root": m, "max_model_len": 4096}
    for m in MODELS]}).encode()


class Server(asyncio.Protocol):
    token_s = 0.02
    metrics = b"".join(b'vllm:%s{model_name="m"} 0\n' % g for g in
                       (b"num_requests_running", b"num_requests_waiting", b"kv_cache_usage_perc"))

    def __init__(self) -> None:
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while self.timer is None:  # one request at a time per connection (no pipelining mid-stream)
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v)
            if len(self.buf) < head_end + 4 + length:
                return
            body = self.buf[head_end + 4:head_end + 4 + length]
            self.buf = self.buf[head_end + 4 + length:]
            method, path = head.split(" ", 2)[:2]
            self.handle(method, path.split("?", 1)[0], body)

    def handle(self, method: str, path: str, body: bytes) -> None:
        t = self.transport
        assert t is not None
        if method == "GET":
            if path == "/health":
                t.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            elif path == "/v1/models":
                t.write(_response("200 OK", MODELS_BODY))
            elif path == "/metrics":
                t.write(_response("200 OK", self.metrics, b"text/plain"))
            else:
                t.write(_response("404 Not Found", b'{"error":"not found"}'))
            return
        try:
            doc = json.loads(body)
            model = doc.get("model")
        except ValueError:
            t.write(_response("400 Bad Request", b'{"error":{"message":"bad json"}}'))
            return
        if model not in MODELS:
            t.write(_response("404 Not Found", b'{"error":{"message":"no such model"}}'))
            return
        chat = "chat" in path
        n = int(doc.get("max_tokens") or doc.get("max_completion_tokens") or 16)
        if not doc.get("stream"):
            t.write(_completion(model, chat, n))
            return
        tok, final, done = EVENTS[(model, chat)]
        if model != "paced":
            t.write(SSE_HEAD + tok * n + final + done + CHUNK_END)
            return
        t.write(SSE_HEAD + tok)
        self._pace(time.monotonic(), 1, n, tok, final + done + CHUNK_END)

    def _pace(self, start: float, i: int, n: int, tok: bytes, tail: bytes) -> None:
        self.timer = None
        if self.closed:
            return
        assert self.transport is not None
        if i >= n:
            self.transport.write(tail)
            if self.buf:
                self.data_received(b"")
            return
        loop = asyncio.get_running_loop()
        self.timer = loop.call_at(loop.time() + max(0.0, start + i * self.token_s - time.monotonic()),
                                  self._step, start, i, n, tok, tail)

    def _step(self, start: float, i: int, n: int, tok: bytes, tail: bytes) -> None:
        if not self.closed:
            assert self.transport is not None
            self.transport.write(tok)
        self._pace(start, i + 1, n, tok, tail)


async def serve(port: int, reuse_port: bool = False, fd: int | None = None) -> None:
    loop = asyncio.get_running_loop()
    if fd is not None:  # a listening socket shared with its siblings, as vLLM's API servers share one
        server = await loop.create_server(Server, sock=socket.socket(fileno=fd), backlog=4096)
    else:
        # reuse_port: several of these processes share one port (bench/workers, where one core of
        # upstream is not enough for many gateway workers); the kernel spreads connections.
        server = await loop.create_server(Server, "127.0.0.1", port, backlog=4096, reuse_address=True,
                                          reuse_port=reuse_port)
    print(f"upstream on {port}", flush=True)
    gc.freeze()  # as the gateway does: no full collection of the startup heap mid-phase
    await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--token-ms", type=float, default=20.0)
    ap.add_argument("--reuse-port", action="store_true")
    ap.add_argument("--fd", type=int, help="serve on this inherited listening socket")
    ap.add_argument("--shared", type=int, default=0,
                    help="listen here, then run this many processes on that one socket, as vLLM's "
                         "--api-server-count does (bench/compare/shared_accept.py)")
    a = ap.parse_args()
    if a.shared:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", a.port))
        sock.listen(4096)
        fd = sock.fileno()
        argv = [sys.executable, __file__, "--port", str(a.port), "--token-ms", str(a.token_ms), "--fd", str(fd)]
        for kid in [subprocess.Popen(argv, pass_fds=[fd]) for _ in range(a.shared)]:
            kid.wait()  # they go with this process's group
        return
    Server.token_s = a.token_ms / 1000
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(a.port, a.reuse_port, a.fd))
    else:
        uvloop.run(serve(a.port, a.reuse_port, a.fd))


if __name__ == "__main__":
    main()
