"""Hostile bytes over raw sockets, for what a schema-driven fuzzer cannot send: broken request
lines and framing, odd headers, wrong or lying Content-Length, non-JSON and non-UTF-8 bodies,
deep JSON, path tricks. Seeded, bounded in count (CASES) and per-case time.

The check is the same as test_fuzz's: no 5xx from the gateway itself (a 5xx without
``x-fleet-backend``), and the gateway still healthy and serving afterwards.
"""

from __future__ import annotations

import collections
import json
import random
import socket
from collections.abc import Callable

import httpx

from tests.chaos.conftest import Pair

CASES = 300
SEED = 4
PATHS = ["/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/x", "/v1/../fleet", "/v1//completions",
         "/v1/%2e%2e/health", "/v1/completions?x=1", "http://evil.example/v1/completions", "/v1/" + "a" * 3000,
         "/fleet", "/metrics", "/", "*", "/v1/c\u00e9"]
METHODS = ["POST", "GET", "PUT", "DELETE", "OPTIONS", "HEAD", "PATCH", "BREW", "POST"]


def _bodies(rng: random.Random) -> bytes:
    choices: list[Callable[[], bytes]] = [
        lambda: b"",
        lambda: rng.randbytes(rng.randint(1, 512)),
        lambda: b"{" * rng.randint(1, 5000),
        lambda: json.dumps({"model": "m", "prompt": "x", "max_tokens": rng.choice([1, 8, -1, 10**30, "8", None, 1.5,
                                                                               True, [], {}])}).encode(),
        lambda: json.dumps({"model": rng.choice(["m", "", None, 1, ["m"], {"a": 1}, "m" * 5000, "\u0000"]),
                            "stream": rng.choice([True, False, "yes", None])}).encode(),
        lambda: json.dumps([{"model": "m"}]).encode(),
        lambda: b'{"model": "m", "prompt": "\xff\xfe"}',
        lambda: json.dumps({"model": "m", "n": rng.choice([0, 1, 99, -5, "2"]), "api_base": "http://evil/"}).encode(),
        lambda: b'{"model": "m"' + b', "a": [' * 2000 + b"]" * 2000 + b"}",
    ]
    return rng.choice(choices)()


def _request(rng: random.Random) -> bytes:
    method = rng.choice(METHODS)
    path = rng.choice(PATHS)
    body = _bodies(rng)
    headers = [f"Host: {rng.choice(['127.0.0.1', 'evil.example', '', 'x' * 300])}"]
    length = rng.choice(["exact", "exact", "exact", "short", "missing", "bogus", "chunked", "negative"])
    if length == "exact":
        headers.append(f"Content-Length: {len(body)}")
    elif length == "short":
        headers.append(f"Content-Length: {max(0, len(body) - 3)}")
    elif length == "bogus":
        headers.append("Content-Length: 12abc")
    elif length == "negative":
        headers.append("Content-Length: -1")
    elif length == "chunked":
        headers.append("Transfer-Encoding: chunked")
        body = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n" if rng.random() < 0.7 else b"zz\r\n" + body
    extra = rng.choice([[], ["Content-Type: application/json"], ["X-Request-ID: " + "r" * 500],
                        ["Authorization: Bearer \u00ff".encode("latin-1").decode("latin-1")],
                        ["X-Forwarded-Host: evil.example", "Forwarded: host=evil"], ["Connection: upgrade, close"],
                        ["Bad Header: x"], ["X-Big: " + "b" * 20000], ["Expect: 100-continue"]])
    headers += extra
    version = rng.choice(["HTTP/1.1", "HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/9", ""])
    head = f"{method} {path} {version}\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n"
    return head.encode("utf-8", errors="surrogateescape") + body


def _send(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server closed early (e.g. it rejected the head): read what it said
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return out


def test_raw_garbage_gets_no_gateway_5xx(make_pair: Callable[..., Pair]) -> None:
    a, b, gw = make_pair(env={"FLEET_MAX_TOKENS_CAP": "64", "FLEET_MAX_N_CAP": "4", "FLEET_HEADERS_TIMEOUT_S": "5",
                              "FLEET_MAX_BODY_BYTES": "65536"}, flags=("--fake-validate",))
    rng = random.Random(SEED)
    statuses: collections.Counter[str] = collections.Counter()
    bad: list[str] = []
    for _ in range(CASES):
        data = _request(rng)
        reply = _send(gw.port, data)
        while reply.startswith(b"HTTP/1.1 100"):  # an interim 100 Continue: judge the final answer
            reply = reply.split(b"\r\n\r\n", 1)[-1]
            statuses["100 Continue first"] += 1
        if not reply:
            statuses["closed without answer"] += 1
            continue
        status_line, _, rest = reply.partition(b"\r\n")
        parts = status_line.split()
        code = parts[1].decode() if len(parts) > 1 else "?"
        statuses[code] += 1
        head = rest.split(b"\r\n\r\n", 1)[0].lower()
        if code.startswith("5") and b"x-fleet-backend:" not in head:
            bad.append(f"{code} for {data[:200]!r}: {reply[:300]!r}")
        assert b"Traceback" not in reply, reply[:500]
    print("\nraw fuzz", CASES, "cases:", dict(statuses))
    assert not bad, bad[:5]
    assert gw.alive() and a.alive() and b.alive()
    r = httpx.post(gw.url + "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 4}, timeout=5)
    assert r.status_code == 200, r.text
    assert gw.all_healthy()
