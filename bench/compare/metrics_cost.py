"""The CPU one request's metric updates cost: handed to prometheus_client one by one (as before
gateway/tally.py), and through GatewayMetrics' Tally as the gateway runs it (one worker: flushed
by the scrape; ``--multiprocess``: at the end of each loop turn). Same process, variants
alternated, a loop turn every 1 or 16 requests; the turns alone are measured too and taken off.

A request's updates: its count, the routing decision, the backend's in-flight gauge up and down,
time to first byte and duration. Under load many requests end in one turn; one at a time, each
has its own.

    .venv/bin/python bench/compare/metrics_cost.py [--rounds 5] [--requests 100000] [--multiprocess]

``--multiprocess``: prometheus_client's multiprocess values (memory-mapped files), as the
gateway's workers use them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


async def run(how: str, n: int, per_turn: int) -> None:
    from gateway.metrics import GatewayMetrics

    m = GatewayMetrics()
    req = m.requests.labels("m", "b", "200")
    dec = m.routing.labels("m", "round_robin", "balanced")
    gauge = m.in_flight.labels("b")
    ttfb = m.ttfb.labels("m")
    dur = m.duration.labels("m")
    for i in range(n):
        if how == "one by one":
            dec.inc()
            gauge.inc()
            ttfb.observe(0.003)
            gauge.dec()
            req.inc()
            dur.observe(0.004)
        elif how != "turns only":
            m.decision("m", "round_robin", "balanced")
            m.backend_in_flight("b", 1)
            m.observe_ttfb("m", 0.003)
            m.backend_in_flight("b", 0)
            m.count("m", "b", 200)
            m.observe_duration("m", 0.004)
        if i % per_turn == per_turn - 1:
            await asyncio.sleep(0)
    m.render()  # what is still pending, as a scrape would


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--multiprocess", action="store_true")
    a = ap.parse_args()
    if a.multiprocess:  # read by prometheus_client when first imported (in run())
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="metrics-cost-")
    loop = asyncio.new_event_loop()
    hows = ("turns only", "one by one", "tally")
    res: dict[tuple[str, int], list[float]] = {(h, k): [] for k in (1, 16) for h in hows}
    for _ in range(a.rounds):
        for how, per_turn in res:
            t0 = time.process_time()
            loop.run_until_complete(run(how, a.requests, per_turn))
            res[how, per_turn].append((time.process_time() - t0) / a.requests * 1e6)
    for per_turn in (1, 16):
        turns = statistics.median(res["turns only", per_turn])
        base = statistics.median(res["one by one", per_turn]) - turns
        print(f"{per_turn} request(s) per loop turn (the turns alone: {turns:.2f} µs per request):")
        for how in hows[1:]:
            cost = statistics.median(res[how, per_turn]) - turns
            print(f"  {how}: {cost:.2f} µs per request, {cost / base:.2f}x one by one")


if __name__ == "__main__":
    main()
