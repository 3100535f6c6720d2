"""Gateway overhead against talking to the upstream directly, in one run, on the fake vLLM.

Placement: the gateway is pinned to CPU 0; the fake upstream and this load generator to CPU 1
(on a machine with fewer than 2 CPUs nothing is pinned). CPU time is the gateway process's own
utime+stime from /proc, so the load generator's and the upstream's cost are not counted.

Reports, per target (direct, gateway): p50/p99 latency one request at a time (non-streaming),
requests/s and p50/p99 at 64 concurrent, and for the gateway CPU µs per request and per relayed
SSE event (64 concurrent streams). Writes bench/results/gateway_overhead.{json,md}.

    .venv/bin/python bench/gateway_overhead.py [--requests 2000] [--streams 64] [--tokens 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.procs import FakeVllm, Gateway, instances  # noqa: E402


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pin(pid: int, cpu: int) -> None:
    if (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(pid, {cpu})


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


BODY = {"model": "m", "prompt": "hello", "max_tokens": 16}


async def _one(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> float:
    t = time.perf_counter()
    async with session.post(url + "/v1/completions", json=body) as r:
        await r.read()
        assert r.status == 200, r.status
    return time.perf_counter() - t


async def sequential(url: str, n: int) -> list[float]:
    async with aiohttp.ClientSession() as s:
        for _ in range(50):
            await _one(s, url, BODY)
        return [await _one(s, url, BODY) for _ in range(n)]


async def concurrent(url: str, n: int, conc: int) -> tuple[list[float], float]:
    lat: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conc)) as s:
        todo = iter(range(n))

        async def worker() -> None:
            for _ in todo:
                lat.append(await _one(s, url, BODY))

        t = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(conc)))
        return lat, time.perf_counter() - t


async def streams(url: str, conc: int, tokens: int) -> int:
    events = 0
    body = {**BODY, "stream": True, "max_tokens": tokens}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conc)) as s:

        async def one() -> None:
            nonlocal events
            async with s.post(url + "/v1/completions", json=body) as r:
                async for line in r.content:
                    if line.startswith(b"data: "):
                        events += 1

        await asyncio.gather(*(one() for _ in range(conc)))
    return events


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=200)
    args = ap.parse_args()
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    fake = FakeVllm(out_dir, ["m"])
    gw = Gateway(out_dir, instances(fake), env={"FLEET_LOG_LEVEL": "warning", "FLEET_HEALTH_INTERVAL_S": "5"})
    try:
        _pin(gw.pid, 0)
        _pin(fake.pid, 1)
        _pin(os.getpid(), 1)
        res: dict[str, Any] = {"requests": args.requests, "streams": args.streams, "tokens": args.tokens}
        for name, url in (("direct", fake.url), ("gateway", gw.url)):
            seq = asyncio.run(sequential(url, args.requests // 4))
            c0 = _cpu_seconds(gw.pid)
            lat, wall = asyncio.run(concurrent(url, args.requests, 64))
            c1 = _cpu_seconds(gw.pid)
            ev = asyncio.run(streams(url, args.streams, args.tokens))
            c2 = _cpu_seconds(gw.pid)
            row = {"p50_ms_1": statistics.median(seq) * 1e3, "p99_ms_1": _pct(seq, 0.99) * 1e3,
                   "rps_64": len(lat) / wall, "p50_ms_64": statistics.median(lat) * 1e3,
                   "p99_ms_64": _pct(lat, 0.99) * 1e3, "events": ev}
            if name == "gateway":
                row["cpu_us_per_request_64"] = (c1 - c0) / len(lat) * 1e6
                row["cpu_us_per_event"] = (c2 - c1) / ev * 1e6
            res[name] = row
        d, g = res["direct"], res["gateway"]
        res["added_p50_ms_1"] = g["p50_ms_1"] - d["p50_ms_1"]
        res["added_p99_ms_1"] = g["p99_ms_1"] - d["p99_ms_1"]
        res["rps_ratio_64"] = g["rps_64"] / d["rps_64"]
    finally:
        gw.stop()
        fake.stop()
    (out_dir / "gateway_overhead.json").write_text(json.dumps(res, indent=2))
    md = [
        "| metric | direct | gateway | gateway / direct |", "|---|---|---|---|",
        f"| p50 latency, 1 at a time (ms) | {d['p50_ms_1']:.2f} | {g['p50_ms_1']:.2f} | "
        f"{g['p50_ms_1'] / d['p50_ms_1']:.2f}× (+{res['added_p50_ms_1']:.2f} ms) |",
        f"| p99 latency, 1 at a time (ms) | {d['p99_ms_1']:.2f} | {g['p99_ms_1']:.2f} | "
        f"{g['p99_ms_1'] / d['p99_ms_1']:.2f}× |",
        f"| requests/s, 64 concurrent | {d['rps_64']:.0f} | {g['rps_64']:.0f} | {res['rps_ratio_64']:.2f}× |",
        f"| p50 latency, 64 concurrent (ms) | {d['p50_ms_64']:.2f} | {g['p50_ms_64']:.2f} | "
        f"{g['p50_ms_64'] / d['p50_ms_64']:.2f}× |",
        f"| gateway CPU per request, 64 concurrent (µs) | | {g['cpu_us_per_request_64']:.0f} | |",
        f"| gateway CPU per relayed SSE event, {args.streams} streams (µs) | | {g['cpu_us_per_event']:.1f} | |",
    ]
    (out_dir / "gateway_overhead.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
