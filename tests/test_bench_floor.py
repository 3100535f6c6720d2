"""bench/compare/floor.py's floors without ASGI (``--raw``, ``--lean``): an HTTP/1.1 answer from a
protocol of its own, to each request on one kept-alive connection, as the load generator uses it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.procs import free_port

FLOOR = Path(__file__).resolve().parents[1] / "bench" / "compare" / "floor.py"
REQUEST = (b'POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n'
           b'content-length: 15\r\n\r\n{"model": "m"}\n')


def _connect(port: int, proc: subprocess.Popen[bytes]) -> socket.socket:
    deadline = time.monotonic() + 10
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "the floor did not listen"
            time.sleep(0.05)


@pytest.mark.parametrize("server", ["raw", "raw-task", "lean"])
def test_raw_floor_answers_each_request_on_one_connection(server: str) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(FLOOR), "--serve", str(port), "--server", server])
    try:
        with _connect(port, proc) as sock:
            sock.sendall(REQUEST * 3)  # pipelined on one connection: three answers, in order
            got = b""
            while got.count(b"HTTP/1.1 200 OK") < 3 or not got.endswith(b"}"):
                chunk = sock.recv(65536)
                assert chunk, f"closed after {got!r}"
                got += chunk
        answers = got.split(b"HTTP/1.1 200 OK\r\n")[1:]
        assert len(answers) == 3
        for a in answers:
            head, body = a.split(b"\r\n\r\n")
            assert int(dict(h.split(b": ") for h in head.split(b"\r\n"))[b"content-length"]) == len(body)
            assert json.loads(body)["choices"][0]["message"]["content"] == "hi"
    finally:
        proc.kill()
        proc.wait()
