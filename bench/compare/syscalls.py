"""The system calls each proxy makes per request, and its user and system CPU, side by side: the
gateway and vllm-router in turn on CPU 0 in front of run.py's fake upstream, the load (run.py's
conc phase: non-streamed requests, 64 concurrent) and the upstream on CPU 1. ``perf stat`` counts
every ``syscalls:sys_enter_*`` tracepoint on all of the proxy's threads during the measured load
(needs perf and root; apt install linux-tools-generic where it is missing).

    .venv/bin/python bench/compare/syscalls.py [--requests 20000] [--passes 2]

It answers whether the gap in CPU per request between the two (bench/README.md) is in the kernel
(more or smaller reads and writes, extra wake-ups) or in user space.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import loadgen
from run import PROXY_CPU, _run, side_upstream
from targets import ROOT, Proc, _in_group, gateway, vllm_router


def _count(p: Proc, url: str, requests: int, out: Path) -> tuple[Counter[str], float, float, int]:
    """The syscalls, user s and system s of ``p`` over ``requests`` requests (and the load
    generator's own first round, which it also serves), and how many requests that was."""
    _run(loadgen.requests(url, 3000, 64, 60))  # connections open, caches warm
    tids = [t for pid in _in_group(p.pid) for t in os.listdir(f"/proc/{pid}/task")]
    perf = subprocess.Popen(["perf", "stat", "-x", ",", "-e", "syscalls:sys_enter_*", "-t", ",".join(tids),
                             "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.5)  # perf attaches to every tracepoint before the load starts
    u0, s0 = p.cpu_split()
    r = _run(loadgen.requests(url, requests, 64, 120))
    u1, s1 = p.cpu_split()
    perf.send_signal(signal.SIGINT)
    perf.wait(120)
    calls: Counter[str] = Counter()
    for line in out.read_text().splitlines():
        f = line.split(",")
        if len(f) > 3 and f[0].strip().isdigit():
            calls[f[2].removeprefix("syscalls:sys_enter_")] += int(f[0])
    return calls, u1 - u0, s1 - s0, r.done + 64  # loadgen's warm-up round of 64 ran in the window too


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--passes", type=int, default=2)
    a = ap.parse_args()
    work, upstream, up_url = side_upstream()
    try:
        for i in range(a.passes):
            for name in ("gateway", "vllm-router") if i % 2 == 0 else ("vllm-router", "gateway"):
                p, url, _ = (gateway(work, up_url, PROXY_CPU, work) if name == "gateway" else
                             vllm_router(work, up_url, PROXY_CPU, ROOT / "bench" / "results" / "venvs"))
                try:
                    calls, user, system, n = _count(p, url, a.requests, work / f"perf-{name}.txt")
                finally:
                    p.stop()
                top = ", ".join(f"{k} {v / n:.2f}" for k, v in calls.most_common() if v / n >= 0.005)
                print(f"pass {i} {name}: {n} requests; user {user / n * 1e6:.1f} µs, system "
                      f"{system / n * 1e6:.1f} µs per request; syscalls per request "
                      f"{sum(calls.values()) / n:.2f}: {top}")
    finally:
        upstream.stop()


if __name__ == "__main__":
    main()
