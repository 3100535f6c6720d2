"""Soak: minutes of mixed load through the gateway while replicas are killed and restarted.

Two fake replicas of model 'm' behind ``python -m gateway`` on loopback. Load: ``--clients``
non-streaming clients and as many streaming ones (closed loop, each request bounded by a client
timeout). Faults: every ``--fault-every-s`` seconds one replica (alternating) gets SIGKILL and is
restarted ``--down-s`` seconds later. Reports the gateway process's RSS and open file descriptors
at start, after warm-up, every minute and at the end (memory growth), the request count, errors by
kind (see tests/chaos/load.py for the outcome names) and p50/p99 latency per kind of request; and
the streams that continued on another replica (docs/stream-failover.md): the gap at the splice as
the client saw it (the chunks' ``system_fingerprint`` names the fake that made them), the gateway's
``fleet_stream_migrations_total`` and its splice histograms. Writes bench/results/soak.{json,md}
and prints the table.

    .venv/bin/python bench/chaos/soak.py [--minutes 5] [--clients 4] [--fault-every-s 30] [--down-s 5]

Bounded: by ``--minutes`` and by ``--max-requests`` (default 2,000,000) in total.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.chaos.load import OK, Tally, closed_loop  # noqa: E402
from tests.support.procs import FakeVllm, Gateway, instances  # noqa: E402

RESULTS = ROOT / "bench" / "results"
ENV = {"FLEET_HEALTH_INTERVAL_S": "0.5", "FLEET_HEALTH_TIMEOUT_S": "0.5", "FLEET_HEALTH_FAILURES": "2",
       "FLEET_HEALTH_SUCCESSES": "2", "FLEET_LOG_LEVEL": "warning"}
NON_STREAMING: list[dict[str, Any]] = [
    {"model": "m", "prompt": "soak", "max_tokens": 16},
    {"model": "m", "messages": [{"role": "user", "content": "soak"}], "max_tokens": 16},
]
STREAMING: list[dict[str, Any]] = [{**b, "stream": True} for b in NON_STREAMING]


def proc_sample(pid: int) -> dict[str, float]:
    rss_kib = next(int(ln.split()[1]) for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if ln.startswith("VmRSS:"))
    return {"rss_mib": round(rss_kib / 1024, 1), "fds": len(os.listdir(f"/proc/{pid}/fd"))}


async def soak(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    flags = ("--fake-latency", str(args.latency_s), "--fake-token-delay", str(args.token_delay_s))
    fakes = [FakeVllm(tmp, ["m"], *flags), FakeVllm(tmp, ["m"], *flags)]
    gw: Gateway | None = None
    try:
        gw = Gateway(tmp, instances(*fakes), env=ENV)
        seconds = args.minutes * 60
        t0 = time.monotonic()
        samples: list[dict[str, Any]] = [{"t_s": 0.0, "at": "start", **proc_sample(gw.pid)}]
        faults: list[dict[str, Any]] = []
        plain, streams = Tally(), Tally()

        async def sampler() -> None:
            await asyncio.sleep(args.warmup_s)
            samples.append({"t_s": round(time.monotonic() - t0, 1), "at": "warm", **proc_sample(gw.pid)})
            minute = 1
            while True:
                await asyncio.sleep(max(0.0, t0 + 60 * minute - time.monotonic()))
                samples.append({"t_s": round(time.monotonic() - t0, 1), "at": f"minute {minute}",
                                **proc_sample(gw.pid)})
                minute += 1

        async def faulter() -> None:
            k = 0
            while True:
                await asyncio.sleep(args.fault_every_s - args.down_s)
                f = fakes[k % 2]
                f.signal(signal.SIGKILL)
                fault: dict[str, Any] = {"replica": f"fake-{f.port}", "killed_at_s": round(time.monotonic() - t0, 1),
                                         "back_at_s": None}
                faults.append(fault)
                await asyncio.sleep(args.down_s)
                await asyncio.to_thread(f.restart)
                fault["back_at_s"] = round(time.monotonic() - t0, 1)
                k += 1

        side = [asyncio.create_task(sampler()), asyncio.create_task(faulter())]
        cap = args.max_requests // 2
        try:
            await asyncio.gather(
                closed_loop(gw.url, args.clients, seconds, NON_STREAMING, args.client_timeout_s, plain, cap),
                closed_loop(gw.url, args.clients, seconds, STREAMING, args.client_timeout_s, streams, cap))
        finally:
            for t in side:
                t.cancel()
            await asyncio.gather(*side, return_exceptions=True)
        elapsed = time.monotonic() - t0
        samples.append({"t_s": round(elapsed, 1), "at": "end", **proc_sample(gw.pid)})
        text = await asyncio.to_thread(_get, gw.url + "/metrics")
        metrics = {ln.split()[0]: float(ln.split()[-1]) for ln in text.splitlines()
                   if ln.startswith(("fleet_retries_total", "fleet_backend_ejections_total",
                                     "fleet_stream_migrations_total"))}
        warm = next((s for s in samples if s["at"] == "warm"), samples[0])
        return {
            "config": dict(vars(args)),
            "elapsed_s": round(elapsed, 1),
            "gateway_alive": gw.alive(),
            "samples": samples,
            "rss_growth_mib": {"from_start": round(samples[-1]["rss_mib"] - samples[0]["rss_mib"], 1),
                               "from_warm": round(samples[-1]["rss_mib"] - warm["rss_mib"], 1)},
            "faults": faults,
            "non_streaming": plain.summary(),
            "streaming": streams.summary(),
            "requests": plain.total + streams.total,
            "errors": {k: plain.failures().get(k, 0) + streams.failures().get(k, 0)
                       for k in {*plain.failures(), *streams.failures()}},
            "gateway_metrics": metrics,
            "splice_histograms": {name: histogram(text, name) for name in
                                  ("fleet_stream_splice_gap_seconds", "fleet_stream_splice_overhead_seconds")},
        }
    finally:
        if gw is not None:
            gw.stop()
        for f in fakes:
            f.stop()


def histogram(text: str, name: str) -> dict[str, float | None]:
    """Count, mean and the bucket bounds holding p50 and p99 of a histogram in Prometheus text (summed
    over its labels)."""
    buckets: dict[float, float] = {}
    total = count = 0.0
    for ln in text.splitlines():
        if ln.startswith(name + "_bucket{"):
            le = float(ln.split('le="')[1].split('"')[0])
            buckets[le] = buckets.get(le, 0.0) + float(ln.split()[-1])
        elif ln.startswith(name + "_sum"):
            total += float(ln.split()[-1])
        elif ln.startswith(name + "_count"):
            count += float(ln.split()[-1])

    def bound(q: float) -> float | None:
        return next((le for le, n in sorted(buckets.items()) if n >= q * count), None) if count else None

    return {"count": count, "mean_s": round(total / count, 4) if count else None,
            "p50_le_s": bound(0.5), "p99_le_s": bound(0.99)}


def _get(url: str) -> str:
    import httpx

    return httpx.get(url, timeout=5).text


def markdown(r: dict[str, Any]) -> str:
    c = r["config"]
    out = [f"# Soak: {r['elapsed_s']:.0f} s, {c['clients']} non-streaming + {c['clients']} streaming clients, "
           f"a replica SIGKILLed every {c['fault_every_s']:.0f} s and restarted {c['down_s']:.0f} s later", "",
           "| kind | requests | ok | errors by kind | p50 ms | p99 ms | max ms |", "|---|---|---|---|---|---|---|"]
    for name in ("non_streaming", "streaming"):
        s = r[name]
        errs = ", ".join(f"{k} {v}" for k, v in sorted(s["outcomes"].items()) if k != OK) or "none"
        out.append(f"| {name.replace('_', '-')} | {s['requests']} | {s['outcomes'].get(OK, 0)} | {errs} | "
                   f"{s['p50_s'] * 1000:.1f} | {s['p99_s'] * 1000:.1f} | {s['max_s'] * 1000:.1f} |")
    sp = r["streaming"].get("splices")
    if sp:
        out += ["", f"Streams that continued on another replica (seen by the client): {sp['count']}; the silence at "
                f"the splice p50 {sp['p50_s'] * 1000:.1f} ms, p99 {sp['p99_s'] * 1000:.1f} ms, "
                f"max {sp['max_s'] * 1000:.1f} ms."]
    for name, h in r.get("splice_histograms", {}).items():
        if h["count"]:
            out.append(f"`{name}`: {h['count']:g} splices, mean {h['mean_s'] * 1000:.1f} ms, p50 ≤ "
                       f"{h['p50_le_s']} s, p99 ≤ {h['p99_le_s']} s (bucket bounds).")
    out += ["", f"Faults: {len(r['faults'])} SIGKILLs (each restarted {c['down_s']:.0f} s later unless the run "
            f"ended first). Gateway alive at the end: {r['gateway_alive']}. "
            f"Gateway counters: " + ", ".join(f"`{k}` {v:g}" for k, v in sorted(r["gateway_metrics"].items())), "",
            "| gateway sample | t (s) | RSS (MiB) | open fds |", "|---|---|---|---|"]
    out += [f"| {s['at']} | {s['t_s']} | {s['rss_mib']} | {s['fds']} |" for s in r["samples"]]
    g = r["rss_growth_mib"]
    out += ["", f"RSS growth: {g['from_start']:+.1f} MiB from start, {g['from_warm']:+.1f} MiB from warm-up "
            f"({c['warmup_s']:.0f} s) to end."]
    return "\n".join(out) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--clients", type=int, default=4, help="non-streaming clients, and as many streaming ones")
    p.add_argument("--fault-every-s", type=float, default=30.0)
    p.add_argument("--down-s", type=float, default=5.0)
    p.add_argument("--warmup-s", type=float, default=15.0)
    p.add_argument("--latency-s", type=float, default=0.01, help="replica latency before headers")
    p.add_argument("--token-delay-s", type=float, default=0.005, help="replica delay between stream events")
    p.add_argument("--client-timeout-s", type=float, default=30.0)
    p.add_argument("--max-requests", type=int, default=2_000_000)
    args = p.parse_args()
    if not 0 < args.down_s < args.fault_every_s:
        p.error("--down-s must be between 0 and --fault-every-s")
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        result = asyncio.run(soak(args, Path(tmp)))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "soak.json").write_text(json.dumps(result, indent=1) + "\n")
    md = markdown(result)
    (RESULTS / "soak.md").write_text(md)
    print(md)
    return 0 if result["gateway_alive"] else 1


if __name__ == "__main__":
    sys.exit(main())
