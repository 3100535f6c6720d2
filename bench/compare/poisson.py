"""Time to first token under Poisson arrivals, straight to the fake upstream and through the
gateway, interleaved: what the gateway adds when traffic arrives on its own schedule (issue 21).

Streams of 128 tokens paced at ``--token-ms`` (4.5: the tiny model's ITL on an H100) arrive at
``--rate`` per second for ``--seconds``; each pass alternates which target goes first. The gateway
runs as ``vllm-fleet up`` runs it: warm upstream connections, ``--limit`` of them (vLLM's
``max_num_seqs`` there). Gateway on CPU 0, upstream and load on CPU 1, the load generator on uvloop
with its cyclic GC held off during a pass (run.py's placement and phases).
Prints each pass's TTFT p50 / p90 / p99 / max, then the medians over passes and what the gateway
added to each (gateway − direct, same run).

    .venv/bin/python bench/compare/poisson.py [--rate 60] [--seconds 30] [--passes 3]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

import aiohttp
import loadgen
from run import _run, no_collections, pct, upstream_and_gateway
from targets import ROOT


async def arrivals(url: str, rate: float, seconds: float, seed: int) -> loadgen.Result:
    res = loadgen.Result()
    data = loadgen.body("paced", 128, True)
    rng = random.Random(seed)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        warm = loadgen.Result()  # connections the load will reuse, opened before it is timed
        await asyncio.gather(*(loadgen._stream(s, url, loadgen.body("m", 4, True), warm) for _ in range(64)))
        tasks = []
        now = time.perf_counter()
        end, due = now + seconds, now
        while due < end:
            due += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            tasks.append(asyncio.create_task(loadgen._stream(s, url, data, res)))
        await asyncio.gather(*tasks)
    return res


QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "max": 1.0}  # run.pct's index: 1.0 is the largest


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=60.0, help="arrivals per second")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--token-ms", type=float, default=4.5)
    ap.add_argument("--limit", type=int, default=1024, help="the backend's concurrency limit, warm connections")
    a = ap.parse_args()
    work = ROOT / "bench" / "results" / "compare-work"
    work.mkdir(parents=True, exist_ok=True)
    warm = {"FLEET_UPSTREAM_WARM": "true", "FLEET_BACKEND_MAX_CONCURRENCY": str(a.limit)}
    with upstream_and_gateway(work, a.token_ms, warm) as (_, gw_url, up_url):
        time.sleep(2)  # the warmer opens its connections when the backend enters rotation
        got: dict[str, dict[str, list[float]]] = {t: {k: [] for k in QUANTILES} for t in ("direct", "gateway")}
        for p in range(a.passes):
            order = [("direct", up_url), ("gateway", gw_url)]
            for name, url in order if p % 2 == 0 else order[::-1]:
                with no_collections():  # the load generator's own GC pauses out of the tail (run.py)
                    r = _run(arrivals(url, a.rate, a.seconds, seed=p))
                if r.errors or not r.ttft:
                    raise SystemExit(f"{name}: {r.errors} errors, first: {r.first_error}")
                row = {k: v * 1000 for k, f in QUANTILES.items() if (v := pct(r.ttft, f)) is not None}
                for k, v in row.items():
                    got[name][k].append(v)
                shown = ", ".join(f"{k} {v:.2f}" for k, v in row.items())
                print(f"pass {p} {name:8s} {len(r.ttft)} streams, TTFT ms {shown}", flush=True)
        print(f"\nmedians of {a.passes} passes, {a.rate:g} arrivals/s, TTFT ms")
        for k in QUANTILES:
            d, g = statistics.median(got["direct"][k]), statistics.median(got["gateway"][k])
            print(f"{k:4s} direct {d:7.2f}  gateway {g:7.2f}  added {g - d:+.2f}")


if __name__ == "__main__":
    main()
