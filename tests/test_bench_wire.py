"""bench/compare/wire.py: what a vLLM server receives from the twin benchmark's client, straight and
through the gateway. The gateway's request must reach it as the client's did: in one read (head and
body in one write), the body byte for byte, the client's headers and the request id added."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_gateway_sends_the_clients_request_in_one_read_with_its_headers_and_an_id() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "compare" / "wire.py"), "--requests", "3"],
                         capture_output=True, text=True, timeout=120, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    lines = {path: [line for line in out.splitlines() if line.startswith(path + ":")] for path in ("direct", "gateway")}
    assert all(len(v) == 3 for v in lines.values()), out
    for line in lines["direct"] + lines["gateway"]:
        assert " 1 read(s) of " in line and "body as sent: True" in line, line
    direct = set(lines["direct"][0].split("headers: ")[1].split(", "))
    through = set(lines["gateway"][0].split("headers: ")[1].split(", "))
    assert through - direct == {"x-request-id"} and direct <= through, out
