"""Side by side, in one run: direct to a fake vLLM, the vllm-fleet gateway, nginx, vllm-router, LiteLLM.

Placement: the proxy under test (its whole process tree) on CPU 0; the fake upstream and this
load generator on CPU 1. Proxy CPU is utime+stime of all its processes from /proc, per phase.
Phases, per target, each bounded in count and in time:

  seq     one request at a time, non-streaming            -> p50/p99 latency
  conc    64 concurrent, non-streaming                    -> p50/p99, requests/s, CPU per request
  burst   64 concurrent streams, tokens back to back      -> CPU per relayed SSE event
  paced   256 concurrent streams, one token per 20 ms     -> TTFT, inter-token latency, CPU per event

"added" numbers are the target's minus direct's, same phase, same percentile. The "cpu1 busy"
row is upstream + load generator CPU over wall time: near 1.0 means CPU 1, not the proxy, was
the limit. A target that cannot be installed or started is reported as unavailable, never guessed.

Every number moves from run to run on a shared 2-core VM (the router's own CPU per request
between 64 and 124 µs in one session), so the whole set is measured ``--passes`` times (3),
targets one after another in each pass, and the table gives each row's median over the passes;
the issue's targets are judged on the medians, with each pass's value listed beside them.

    .venv/bin/python bench/compare/run.py [--quick] [--passes N] [--targets gateway,nginx,vllm-router,litellm]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import loadgen
import report
from targets import CLK, ROOT, STARTERS, TWO_CPUS, Proc, Unavailable, gateway, start_upstream

PROXY_CPU, SIDE_CPU = 0, 1


def side_upstream(token_ms: float = 20.0) -> tuple[Path, Proc, str]:
    """This process (the load generator) on SIDE_CPU where there are two, the work folder, and the
    fake upstream started there: (work, the upstream, its URL)."""
    if TWO_CPUS:
        os.sched_setaffinity(0, {SIDE_CPU})
    work = ROOT / "bench" / "results" / "compare-work"
    work.mkdir(parents=True, exist_ok=True)
    upstream, up_url = start_upstream(work, SIDE_CPU, token_ms)
    return work, upstream, up_url


@contextlib.contextmanager
def upstream_and_gateway(work: Path, token_ms: float,
                         env: dict[str, str] | None = None) -> Iterator[tuple[Proc, str, str]]:
    """The fake upstream and this tree's gateway in front of it, placed as the benchmark places
    them (the gateway on PROXY_CPU; the upstream and this process, the load generator, on
    SIDE_CPU), both stopped on the way out: (the gateway, its URL, the upstream's URL)."""
    if TWO_CPUS:
        os.sched_setaffinity(0, {SIDE_CPU})
    up, up_url = start_upstream(work, SIDE_CPU, token_ms)
    gw = None
    try:
        gw, url, _ = gateway(work, up_url, PROXY_CPU, work, env)
        yield gw, url, up_url
    finally:
        if gw is not None:
            gw.stop()
        up.stop()


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


class Meter:
    """CPU seconds of the proxy, the upstream and this process across one phase."""

    def __init__(self, proxy: Proc | None, upstream: Proc) -> None:
        self.proxy = proxy
        self.upstream = upstream

    def snap(self) -> dict[str, float]:
        s = {"upstream": self.upstream.cpu_s()}
        if self.proxy is not None:
            user, system = self.proxy.cpu_split()  # one walk of /proc for both
            s["proxy"], s["proxy_sys"] = user + system, system
        s["loadgen"] = time.process_time()
        f = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        s["host_busy"] = (sum(int(x) for x in f[:8]) - int(f[3]) - int(f[4])) / CLK  # all but idle, iowait
        s["t"] = time.perf_counter()
        return s

    @staticmethod
    def delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
        return {k: b[k] - a[k] for k in a}


@contextlib.contextmanager
def no_collections() -> Iterator[None]:
    # The load generator is Python too: a collection of its heap in the middle of a phase (up to
    # 32 ms measured, 3 ms even with the startup heap frozen) shows up as the tail latency of
    # whichever target runs. So: collect and freeze before, no cyclic GC during (a phase is
    # bounded in count and time; refcounting still frees almost everything), collect after.
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


def phase(meter: Meter, coro: Any) -> tuple[loadgen.Result, dict[str, float]]:
    with no_collections():
        a = meter.snap()
        res = _run(coro)
        return res, Meter.delta(a, meter.snap())


def _run(coro: Any) -> loadgen.Result:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)  # type: ignore[no-any-return]
    return uvloop.run(coro)  # type: ignore[no-any-return]


def measure(url: str, meter: Meter, a: argparse.Namespace, light: bool) -> dict[str, Any]:
    """All four phases against one base URL. ``light`` shrinks counts for targets that are ~100× slower."""
    k = 10 if light else 1
    row: dict[str, Any] = {"errors": 0}
    limit = a.phase_limit_s

    def note(name: str, r: loadgen.Result, d: dict[str, float]) -> None:
        row["errors"] += r.errors
        if r.first_error:
            row.setdefault("first_error", f"{name}: {r.first_error}")
        if r.timed_out:
            row.setdefault("timed_out", []).append(name)
        busy = (d["upstream"] + d["loadgen"]) / d["t"] if d["t"] else 0
        row[f"cpu1_busy_{name}"] = round(busy, 2)
        other = d["host_busy"] - d["upstream"] - d["loadgen"] - d.get("proxy", 0.0)
        row[f"other_cpu_{name}"] = round(max(0.0, other) / d["t"], 2) if d["t"] else None

    r, d = phase(meter, loadgen.requests(url, max(20, a.seq // k), 1, limit))
    note("seq", r, d)
    row.update(p50_ms_1=_ms(pct(r.latencies, 0.5)), p99_ms_1=_ms(pct(r.latencies, 0.99)), n_1=r.done)

    r, d = phase(meter, loadgen.requests(url, max(64, a.requests // k), 64, limit))
    note("conc", r, d)
    row.update(p50_ms_64=_ms(pct(r.latencies, 0.5)), p99_ms_64=_ms(pct(r.latencies, 0.99)), n_64=r.done,
               rps_64=round(r.done / r.wall, 1) if r.wall else None)
    if "proxy" in d and r.done:
        row["cpu_us_per_request_64"] = round(d["proxy"] / r.done * 1e6, 1)
        row["sys_us_per_request_64"] = round(d["proxy_sys"] / r.done * 1e6, 1)

    r, d = phase(meter, loadgen.streams(url, "m", 64, max(20, a.tokens // k), 1, 0.0, limit))
    note("burst", r, d)
    row.update(burst_events=r.events, burst_events_per_s=round(r.events / r.wall) if r.wall else None)
    if "proxy" in d and r.events:
        row["cpu_us_per_event_burst64"] = round(d["proxy"] / r.events * 1e6, 2)

    rounds = min(2, a.rounds) if light else a.rounds
    paced_tokens = a.paced_tokens // 2 if light else a.paced_tokens
    # Starts spread over one stream's duration: at steady state streams arrive one by one, not
    # 256 at once; every worker then runs ``rounds`` streams back to back (full concurrency after
    # the first stream's duration).
    r, d = phase(meter, loadgen.streams(url, "paced", a.paced_streams, paced_tokens, rounds,
                                        paced_tokens * a.token_ms / 1000, limit))
    note("paced", r, d)
    itl = r.itl
    row.update(ttft_p50_ms=_ms(pct(r.ttft, 0.5)), ttft_p99_ms=_ms(pct(r.ttft, 0.99)),
               itl_p50_ms=_ms(pct(itl, 0.5)), itl_p99_ms=_ms(pct(itl, 0.99)),
               itl_mean_ms=_ms(statistics.fmean(itl)) if itl else None,
               paced_streams_done=r.done, paced_events=r.events,
               paced_events_per_s=round(r.events / r.wall) if r.wall else None)
    if "proxy" in d and r.events:
        row["cpu_us_per_event_paced256"] = round(d["proxy"] / r.events * 1e6, 2)
        row["sys_us_per_event_paced256"] = round(d["proxy_sys"] / r.events * 1e6, 2)
        row["proxy_cpu_frac_paced"] = round(d["proxy"] / d["t"], 2)
    return row


def _measure_target(name: str, work: Path, up_url: str, upstream: Proc, a: argparse.Namespace) -> dict[str, Any]:
    proc = None
    try:
        proc, url, ver = STARTERS[name](work, up_url, PROXY_CPU, a.venvs)
        return {"version": ver, **measure(url, Meter(proc, upstream), a, name == "litellm")}
    except Unavailable as e:
        return {"unavailable": str(e)[:500]}
    finally:
        if proc is not None:
            proc.stop()


def _other_load(seconds: float = 2.0) -> float:
    """Cores busy on this host over a short idle window, before the benchmark starts anything."""
    def busy() -> float:
        f = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        return (sum(int(x) for x in f[:8]) - int(f[3]) - int(f[4])) / CLK
    b0, p0 = busy(), time.process_time()
    time.sleep(seconds)
    return max(0.0, busy() - b0 - (time.process_time() - p0)) / seconds


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1e3, 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default="gateway,nginx,vllm-router,litellm")
    ap.add_argument("--seq", type=int, default=1000, help="requests one at a time")
    ap.add_argument("--requests", type=int, default=20000, help="requests at 64 concurrent")
    ap.add_argument("--tokens", type=int, default=200, help="tokens per stream, burst phase")
    ap.add_argument("--paced-streams", type=int, default=256)
    ap.add_argument("--paced-tokens", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3, help="paced streams per worker, one after another")
    ap.add_argument("--token-ms", type=float, default=20.0)
    ap.add_argument("--passes", type=int, default=3,
                    help="measure every target this many times, alternating; the table gives the medians")
    ap.add_argument("--phase-limit-s", type=float, default=60.0)
    ap.add_argument("--venvs", type=Path, default=ROOT / "bench" / "results" / "venvs")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--quick", action="store_true", help="a fifth of the counts, for a smoke run")
    a = ap.parse_args()
    if a.quick:
        a.seq, a.requests, a.rounds, a.paced_tokens, a.passes = a.seq // 5, a.requests // 5, 2, 50, 1
    work = a.out / "compare-work"
    work.mkdir(parents=True, exist_ok=True)
    a.venvs.mkdir(parents=True, exist_ok=True)
    if TWO_CPUS:
        os.sched_setaffinity(0, {SIDE_CPU})
    t_start = time.monotonic()
    res_host_other = _other_load()
    if res_host_other > 0.2:
        print(f"warning: other processes use {res_host_other:.2f} cores of this host; latency numbers will be "
              "noisy, CPU per request/event less so", flush=True)
    upstream, up_url = start_upstream(work, SIDE_CPU, a.token_ms)
    res: dict[str, Any] = {
        "host": {"cpus": os.cpu_count(), "pinned": TWO_CPUS, "python": platform.python_version(),
                 "kernel": platform.release(), "other_cpu_before_cores": round(res_host_other, 2)},
        "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
    }
    names = [t.strip() for t in a.targets.split(",") if t.strip()]
    passes: list[dict[str, Any]] = []
    try:
        for i in range(a.passes):
            # Every pass measures direct and then each target afresh (new processes), so that each
            # pass's ratios and "added" figures come from numbers taken minutes apart at most.
            targets: dict[str, Any] = {}
            print(f"pass {i + 1}/{a.passes}: direct ...", flush=True)
            targets["direct"] = {"version": "fake upstream (bench/compare/upstream.py)",
                                 **measure(up_url, Meter(None, upstream), a, False)}
            for name in names:
                print(f"pass {i + 1}/{a.passes}: {name} ...", flush=True)
                targets[name] = _measure_target(name, work, up_url, upstream, a)
            passes.append({"targets": targets})
    finally:
        upstream.stop()
    for p in passes:
        report.derive(p)
    res["targets"] = report.combine([p["targets"] for p in passes])
    res["passes"] = passes  # every pass's own rows, in the JSON only
    res["wall_s"] = round(time.monotonic() - t_start, 1)
    report.judge(res, passes)
    md = report.markdown(res)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "compare.json").write_text(json.dumps(res, indent=2))
    (a.out / "compare.md").write_text(md)
    print(md)
    print(f"written {a.out / 'compare.json'} and {a.out / 'compare.md'} ({res['wall_s']} s)")


if __name__ == "__main__":
    main()
