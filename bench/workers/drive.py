"""One load-generator process of bench/workers/run.py: one phase, its samples as JSON on stdout.

Several of these run at once, one per core. Each opens its connections first (warm keep-alive
pools through the gateway to the upstream), then waits for the shared absolute start time, so
that the processes load the target over the same window and their counts add up.

    python bench/workers/drive.py --url URL --kind requests|streams --conc C --start-at T --duration-s D
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compare"))
import loadgen


async def run(a: argparse.Namespace) -> dict[str, object]:
    res, warm = loadgen.Result(), loadgen.Result()
    async with loadgen._session(a.conc) as s:
        if a.kind == "requests":
            data = loadgen.body("m", 16, False)
            await asyncio.gather(*(loadgen._one(s, a.url, data, warm) for _ in range(a.conc)))
        else:
            data = loadgen.body("paced", a.tokens, True)
            await asyncio.gather(*(loadgen._stream(s, a.url, loadgen.body("m", 4, True), warm)
                                   for _ in range(a.conc)))
        if warm.errors:
            res.fail(f"warm-up: {warm.first_error}")
        await asyncio.sleep(max(0.0, a.start_at - time.time()))
        cpu0 = time.process_time()
        stop_at = time.perf_counter() + a.duration_s

        async def requester() -> None:
            while time.perf_counter() < stop_at:
                await loadgen._one(s, a.url, data, res)

        async def streamer(i: int) -> None:
            await asyncio.sleep(a.stagger_s * i / a.conc)
            for _ in range(a.rounds):
                if time.perf_counter() >= stop_at:
                    return
                await loadgen._stream(s, a.url, data, res)

        tasks = [asyncio.ensure_future(requester() if a.kind == "requests" else streamer(i)) for i in range(a.conc)]
        _, pending = await asyncio.wait(tasks, timeout=a.duration_s + 30)
        for p in pending:
            p.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        cpu = time.process_time() - cpu0
    return {"done": res.done, "errors": res.errors, "first_error": res.first_error, "events": res.events,
            "latencies": res.latencies, "ttft": res.ttft, "itl": res.itl, "cpu_s": cpu, "timed_out": bool(pending)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--kind", choices=("requests", "streams"), required=True)
    ap.add_argument("--conc", type=int, required=True)
    ap.add_argument("--start-at", type=float, required=True, help="time.time() at which to start")
    ap.add_argument("--duration-s", type=float, required=True, help="requests: run this long; streams: the bound")
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--stagger-s", type=float, default=0.0)
    a = ap.parse_args()
    try:
        import uvloop
    except ImportError:
        out = asyncio.run(run(a))
    else:
        out = uvloop.run(run(a))
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
