"""bench/gpu/api_split.py against real processes: two servers sharing one listening socket (as
vLLM's API servers do), connections from this process, what each server end sent, by process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.support.bench_gpu import RESULTS, load, printed

api_split = load("api_split")

# a server process that accepts on the inherited socket and answers each message with 10x its bytes
SERVER = """
import os, socket, sys, threading
sock = socket.socket(fileno=int(sys.argv[1]))
def serve(c):
    while (data := c.recv(65536)):
        c.sendall(data * 10)
while True:
    c, _ = sock.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


@pytest.fixture
def shared() -> Iterator[tuple[int, list[subprocess.Popen[bytes]]]]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    procs = [subprocess.Popen([sys.executable, "-c", SERVER, str(sock.fileno())], pass_fds=[sock.fileno()])
             for _ in range(2)]
    try:
        yield sock.getsockname()[1], procs
    finally:
        for p in procs:
            p.kill()
            p.wait()
        sock.close()


def _talk(conns: list[socket.socket], size: int) -> None:
    for c in conns:
        c.sendall(b"x" * size)
    for c in conns:
        got = 0
        while got < size * 10:
            got += len(c.recv(65536))


def test_connections_and_bytes_by_server_process(shared: tuple[int, list[subprocess.Popen[bytes]]]) -> None:
    port, procs = shared
    conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(6)]
    try:
        _talk(conns, 1000)  # before the window: not counted
        pids = {"a": procs[0].pid}  # its CPU is what "cores" reports
        before = api_split.snapshot({"a": port}, pids)
        _talk(conns, 20_000)
        late = socket.create_connection(("127.0.0.1", port))  # opened inside the window: counts from zero
        _talk([late], 5_000)
        time.sleep(0.05)
        after = api_split.snapshot({"a": port}, pids)
        out = api_split.window(before, after, 1.0, {os.getpid(): "direct"})
    finally:
        for c in conns:
            c.close()
    late.close()
    servers = out["instances"]["a"]["servers"]
    assert out["seen"] >= 14  # both ends of each
    assert set(servers) <= {str(p.pid) for p in procs}  # each server end is held by a server process
    assert sum(d["direct"]["conns"] for d in servers.values()) == 7
    assert sum(d["direct"]["active"] for d in servers.values()) == 7  # all sent within ACTIVE_MS
    sent = sum(d["direct"]["sent_mb"] for d in servers.values())
    assert sent == pytest.approx((6 * 200_000 + 50_000) / 1e6, abs=0.02)
    assert list(out["instances"]["a"]["cores"]) == [f"{api_split._name(procs[0].pid)} {procs[0].pid}"]


def test_window_reads_roles_and_new_connections() -> None:
    cpu0 = {"a": {7: ("VLLM::APIServer_0", 10.0), 8: ("VLLM::APIServer_1", 20.0)}}
    cpu1 = {"a": {7: ("VLLM::APIServer_0", 25.0), 8: ("VLLM::APIServer_1", 30.0)}}
    before = {"conns": {"a": {"k1": (7, 100, 1_000_000, 5)}}, "cpu": cpu0, "seen": 1}
    after = {"conns": {"a": {"k1": (7, 100, 3_000_000, 5), "k2": (8, 100, 500_000, 9000),
                             "k3": (8, 200, 0, 1), "k4": (8, None, 0, 1)}}, "cpu": cpu1, "seen": 1}
    out = api_split.window(before, after, 10.0, {100: "gateway", 200: "direct"})["instances"]["a"]
    assert out["cores"] == {"VLLM::APIServer_0 7": 1.5, "VLLM::APIServer_1 8": 1.0}
    assert out["servers"]["7"] == {"gateway": {"conns": 1, "active": 1, "sent_mb": 2.0}}
    assert out["servers"]["8"] == {"gateway": {"conns": 1, "active": 0, "sent_mb": 0.5},
                                   "direct": {"conns": 1, "active": 1, "sent_mb": 0.0},
                                   "other": {"conns": 1, "active": 1, "sent_mb": 0.0}}


def test_the_write_up_matches_its_rows(capsys: pytest.CaptureFixture[str]) -> None:
    rows = str(RESULTS / "twin-api2-split-h200x2" / "rows.json.gz")
    out = printed(capsys, "api_split", [rows])
    for line in ("| 8 gb | gateway:b | 62 | 3584 | 499 / 3 | 510 / 487 | 510 / 487 | 1.03 / 0.15 |",
                 "| 10 gb | gateway:b | 70 | 810 | 510 / 1 | 976 / 3 | 976 / 3 | 0.99 / 0.12 |",
                 "| 6 gb | gateway:b | 144 | 746 | 385 / 45 | 860 / 47 | 860 / 47 | 1.01 / 0.55 |",
                 "| direct | 15 | 0 | 0 | 0 of 15 |", "| gateway | 15 | 6 | 6 | 0 of 9 |",
                 "| gateway's busier API server ≥ 0.8 | 6 | 0.663 (0.506–0.854) | 2.065 (1.569–7.369) |",
                 "| gateway's below | 9 | 0.985 (0.961–1.058) | 1.004 (0.868–1.297) |"):
        assert line in out, line
    # the share of late first tokens (over 1.2 s) by pick: most recently used here, random later
    assert "| gateway | below | 9 | 0.2% (0.1%–1.1%) |" in out
    balance = printed(capsys, "api_split", [str(RESULTS / "twin-api2-balance-h200x2" / "rows.json.gz")])
    assert "| gateway | below | 16 | 10.9% (3.0%–21.0%) |" in balance
    assert "| direct | below | 15 | 0.4% (0.0%–2.7%) |" in balance
    # the shipped pick (fewest busy, then most recently used): the gateway's split even, the kernel's not
    pick_rows = str(RESULTS / "twin-api2-pick-h200x2" / "rows.json.gz")
    pick = printed(capsys, "api_split", [pick_rows])
    for line in ("| 7 ga | direct:b | 104 | 750 | 414 / 25 | 414 / 25 | 647 / 452 | 1.00 / 0.46 | 11.9% |",
                 "| 7 ga | gateway:a | 414 | 366 | 256 / 256 | 534 / 491 | 534 / 491 | 0.94 / 0.93 | 0.0% |",
                 "| gateway | below | 12 | 0.0% (0.0%–1.2%) |",
                 "| direct's busier API server ≤ 0.65 | 8 | 1.022 (0.965–1.065) | 0.982 (0.904–1.050) |"):
        assert line in pick, line
    stats = printed(capsys, "twin_stats", ["--slow-ttft-ms", "2400", rows])
    assert "| tokens/s | 0.882 (0.721–0.972), 1 of 7 |" in stats
    assert "| TTFT p50 | 1.455 (1.118–2.529), 6 of 7 |" in stats
    pick_stats = printed(capsys, "twin_stats", ["--slow-ttft-ms", "2400", pick_rows])
    assert "| tokens/s | 1.031 (1.001–1.108), 5 of 6 |" in pick_stats
    assert "| TTFT p50 | 0.976 (0.846–1.021), 3 of 6 |" in pick_stats
    assert "| TTFT p99 | 0.893 (0.632–0.947), 0 of 6 |" in pick_stats
