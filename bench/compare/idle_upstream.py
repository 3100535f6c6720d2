"""Do idle connections cost vLLM's API server anything? Real vLLM (CPU build, the tiny model).

The gateway holds a warm pool of vLLM's ``--max-num-seqs`` connections to each instance; at 512
streams against an H200 under vLLM's defaults that is 1,024 where a direct client opens 512, and
the pool at 512 read TTFT p50 0.92× direct against 1.20× at 1,024 (rank-sum p = 0.07,
bench/gpu/results/twin-pool512-h200x2). If idle connections cost vLLM's API server work, that is
a mechanism. This measures it on the real server: the twin benchmark's client
(bench/gpu/window_client.py, a closed loop of streams) against one CPU vLLM, in passes that hold,
beside the load, no other connection (``none``), ``--idle`` connections opened and never used
(``fresh``: the gateway's warm connections that no request has taken), or as many that each
carried one ``GET /health`` and then stayed open (``used``: as the pool's connections are after a
burst). Passes run in blocks none, fresh, used, used, fresh, none, so that a drift over the run
weighs on each mode alike; each ``fresh`` and ``used`` pass is compared with the ``none`` passes
of its block.

Per pass: the load's output tokens/s and TTFT p50 (window_client.py's), and the CPU time of vLLM's
API server process and of the rest of its group (engine core, worker) over the window, per 1,000
output tokens.

    .venv/bin/python bench/compare/idle_upstream.py [--idle 512] [--conc 32] [--blocks 3] [--out ROWS]
    .venv/bin/python bench/compare/idle_upstream.py --rows ROWS...   # the table over saved runs
    .venv/bin/python bench/compare/idle_upstream.py --blocks 1 --perf DIR  # and perf on the API server
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from targets import ROOT

from tests.support.procs import free_port
from tests.support.real_vllm import TINY_MODEL_DIR, start_real_vllm

CLIENT = ROOT / "bench" / "gpu" / "window_client.py"
MODES = ("none", "fresh", "used")
TICK = os.sysconf("SC_CLK_TCK")
KEEP_ALIVE = {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "3600"}  # as `vllm-fleet up` starts its instances: idle ones stay


def cpu_s(pid: int) -> float:
    """A process's user and system CPU seconds, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def hold(port: int, n: int, used: bool) -> list[socket.socket]:
    """``n`` connections to the server, each (``used``) after one keep-alive ``GET /health``."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        if used:
            s.sendall(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            head = b""
            while b"\r\n\r\n" not in head:  # /health answers an empty body: the head is all of it
                head += s.recv(4096)
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"GET /health on an idle connection answered {head[:40]!r}")
        socks.append(s)
    return socks


def still_open(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the server has not closed (nothing to read, no end of stream)."""
    n = 0
    for s in socks:
        try:
            n += s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            n += 1
        except OSError:  # reset: closed too
            pass
    return n


def one_pass(server: Any, mode: str, a: argparse.Namespace, work: Path, seed: int) -> dict[str, Any]:
    socks = [] if mode == "none" else hold(server.port, a.idle, used=mode == "used")
    others = [p for p in server.members() if p != server.pgid]
    try:
        time.sleep(1.0)
        t0 = time.monotonic() + 1.0
        out = work / f"side-{seed}.json"
        client = subprocess.Popen([sys.executable, str(CLIENT), "--base", server.url, "--model", server.model,
                                   "--tokenizer", str(TINY_MODEL_DIR), "--conc", str(a.conc), "--t0", str(t0),
                                   "--warmup", str(a.warmup), "--window", str(a.window), "--tail", "2",
                                   "--seed", str(seed), "--out", str(out)])
        perf = None
        try:
            time.sleep(max(0.0, t0 + a.warmup - time.monotonic()))
            api0, rest0 = cpu_s(server.pgid), sum(cpu_s(p) for p in others)
            if a.perf:  # the API server alone, over the window: perf report -i DIR/pass-N-MODE.data
                perf = subprocess.Popen(["perf", "record", "-F", "499", "-p", str(server.pgid), "-o",
                                         f"{a.perf}/pass-{seed}-{mode}.data", "--", "sleep", str(a.window)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(max(0.0, t0 + a.warmup + a.window - time.monotonic()))
            api, rest = cpu_s(server.pgid) - api0, sum(cpu_s(p) for p in others) - rest0
            held = still_open(socks)
        finally:
            if perf is not None:
                perf.wait(timeout=30)
            try:
                rc = client.wait(timeout=a.warmup + a.window + 120)
            except subprocess.TimeoutExpired:
                client.kill()  # never left behind
                client.wait()
                raise
            if rc != 0:
                raise RuntimeError(f"window_client.py exited with {rc}")
    finally:
        for s in socks:
            s.close()
    side = json.loads(out.read_text())
    tokens = side["output_throughput"] * a.window
    if side["errors"] or not tokens:
        raise RuntimeError(f"pass {seed} ({mode}): {side['errors']} errors, {tokens:.0f} tokens")
    return {"mode": mode, "idle_open": held, "tokens_s": side["output_throughput"],
            "ttft_p50_ms": side["median_ttft_ms"],
            "api_ms_per_1k": round(api / tokens * 1e6, 2), "rest_ms_per_1k": round(rest / tokens * 1e6, 2)}


def report(rows: list[dict[str, Any]]) -> str:
    """Each of fresh and used against the ``none`` passes of its block: median ratio (lowest–highest),
    how many passes above 1."""
    keys = (("tokens/s", "tokens_s"), ("TTFT p50", "ttft_p50_ms"), ("API server CPU per token", "api_ms_per_1k"),
            ("engine's CPU per token", "rest_ms_per_1k"))
    blocks = [rows[i:i + 2 * len(MODES)] for i in range(0, len(rows), 2 * len(MODES))]
    lines = ["| mode ÷ none (same block) | " + " | ".join(name for name, _ in keys) + " |",
             "|---" * (len(keys) + 1) + "|"]
    for mode in MODES[1:]:
        cells = []
        for _, key in keys:
            ratios = [r[key] / statistics.mean(n[key] for n in b if n["mode"] == "none")
                      for b in blocks for r in b if r["mode"] == mode]
            cells.append(f"{statistics.median(ratios):.3f} ({min(ratios):.3f}–{max(ratios):.3f}), "
                         f"{sum(x > 1 for x in ratios)} of {len(ratios)} above 1")
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--idle", type=int, default=512, help="connections held open beside the load")
    ap.add_argument("--conc", type=int, default=32, help="the load's streams")
    ap.add_argument("--blocks", type=int, default=3, help="blocks of none, fresh, used, used, fresh, none")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--window", type=float, default=15.0)
    ap.add_argument("--out", help="write the rows here (JSON)")
    ap.add_argument("--perf", help="a folder: perf record of the API server over each window, one file a pass")
    ap.add_argument("--rows", nargs="+", help="no run: the table over these runs' rows (--out files) together")
    a = ap.parse_args(argv)
    if a.rows:
        print(report([r for p in a.rows for r in json.loads(Path(p).read_text())]))
        return
    if not (TINY_MODEL_DIR / "config.json").exists():
        from vllm_fleet.tinymodel import make_tiny_model
        make_tiny_model(str(TINY_MODEL_DIR))
    rows: list[dict[str, Any]] = []
    with (tempfile.TemporaryDirectory() as tmp,
          start_real_vllm(TINY_MODEL_DIR, free_port(), ["tiny"], env=KEEP_ALIVE) as server):
        order = [*MODES, *reversed(MODES)] * a.blocks
        for i, mode in enumerate(order):
            rows.append(one_pass(server, mode, a, Path(tmp), i))
            print(json.dumps(rows[-1]), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))
    print(f"\n{a.idle} idle connections beside {a.conc} streams, {a.blocks} blocks, {a.window:g} s windows:\n")
    print(report(rows))


if __name__ == "__main__":
    main(sys.argv[1:])
