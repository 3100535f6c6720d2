"""What the cyclic collector costs the gateway under load, at CPython's first-generation threshold
(700) and at the gateway's (``gateway.app.YOUNG_GC_THRESHOLD``), alternated pass by pass.

The gateway runs as run.py starts it (CPU 0, its config), wrapped so that ``gc.callbacks`` time
every collection; the fake upstream and the load on CPU 1. Two loads, as run.py's phases: ``conc``
(non-streamed, 64 concurrent) and ``paced`` (256 streams of 100 events 20 ms apart). Per pass and
threshold: collections per 1,000 requests by generation, the collector's µs per request, its
longest pause, and the load's p99 (latency, or TTFT for streams).

    .venv/bin/python bench/compare/gc_pauses.py [--passes 3] [--requests 20000] [--seconds 8]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import loadgen
from run import PROXY_CPU, _run, pct, side_upstream
from targets import ROOT
from targets import gateway as start_gateway

CPYTHON_YOUNG = 700


def _serve(young: int, stats_path: str, rest: list[str]) -> None:
    """The gateway's own main, with its threshold set to ``young`` and every collection timed;
    SIGUSR2 starts counting afresh, SIGUSR1 writes the counts to ``stats_path``."""
    sys.path.insert(0, str(ROOT))
    import gateway.app
    from gateway.main import main

    gateway.app.YOUNG_GC_THRESHOLD = young  # read when the lifespan starts
    pauses: list[tuple[int, float, int]] = []
    began = [0.0]

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            pauses.append((info["generation"], time.perf_counter() - began[0], info["collected"]))

    gc.callbacks.append(timed)
    signal.signal(signal.SIGUSR2, lambda *_: pauses.clear())
    signal.signal(signal.SIGUSR1, lambda *_: Path(stats_path).write_text(json.dumps(pauses)))
    sys.argv = ["gateway", *rest]
    sys.exit(main())


def one(work: Path, up: str, young: int, phase: str, a: argparse.Namespace) -> str:
    stats = work / f"gc-{young}.json"
    launcher = [sys.executable, str(Path(__file__).resolve()), "--serve", "--young", str(young), "--stats", str(stats)]
    p, url, _ = start_gateway(work, up, PROXY_CPU, work, launcher=launcher)
    try:
        _run(loadgen.requests(url, 2000, 64, 30))  # connections open, caches warm
        os.kill(p.pid, signal.SIGUSR2)
        time.sleep(0.2)
        if phase == "conc":
            r = _run(loadgen.requests(url, a.requests, 64, 60))
            n, tail = r.done + 64, pct(r.latencies, 0.99)  # + loadgen's own first round
        else:
            r = _run(loadgen.streams(url, "paced", 256, 100, 10**6, 2.0, a.seconds))
            n, tail = r.done + 256, pct(r.ttft, 0.99)
        stats.unlink(missing_ok=True)
        os.kill(p.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not stats.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        pauses: list[list[Any]] = json.loads(stats.read_text())
    finally:
        p.stop()
    per_gen = [sum(1 for g, _, _ in pauses if g == gen) * 1000 / n for gen in range(3)]
    total = sum(d for _, d, _ in pauses)
    longest = [max((d for g, d, _ in pauses if g == gen), default=0.0) * 1e3 for gen in range(3)]
    return (f"{phase}, threshold {young}: {n} requests, {r.errors} errors; collections per 1,000 requests "
            f"{per_gen[0]:.1f} / {per_gen[1]:.2f} / {per_gen[2]:.2f} (young / middle / old); "
            f"{total / n * 1e6:.2f} µs per request; longest {longest[0]:.2f} / {longest[1]:.2f} / {longest[2]:.2f} ms; "
            f"objects freed {sum(c for _, _, c in pauses)}; "
            f"p99 {'latency' if phase == 'conc' else 'TTFT'} {(tail or 0) * 1e3:.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--seconds", type=float, default=8.0, help="each paced pass")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--young", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--stats", help=argparse.SUPPRESS)
    a, rest = ap.parse_known_args()
    if a.serve:  # the gateway's own arguments follow (-c CONFIG)
        _serve(a.young, a.stats, rest)
        return
    from gateway.app import YOUNG_GC_THRESHOLD

    work, upstream, up_url = side_upstream()
    order = [CPYTHON_YOUNG, YOUNG_GC_THRESHOLD]
    try:
        for i in range(a.passes):
            for phase in ("conc", "paced"):
                for young in order if i % 2 == 0 else order[::-1]:
                    print(f"pass {i}, {one(work, up_url, young, phase, a)}", flush=True)
    finally:
        upstream.stop()


if __name__ == "__main__":
    main()
