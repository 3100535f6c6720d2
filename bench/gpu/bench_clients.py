"""One pass of ``vllm bench serve`` as K client processes at once, merged into one pass's figures.

Why K: one ``vllm bench serve`` is one Python process; at 256 streams of a tiny model it parses
~15k SSE events a second and its own CPU time is part of every TTFT it reports (issue 21: single
passes of one target swung ±25 %). Each pass records each client process's CPU share (its CPU
seconds over the pass's span), so a run shows whether its client was
the limit (1.0: a whole core). With ``--clients K`` each process takes conc/K streams and prompts/K prompts, its own
``--seed`` (distinct random prompts, so none hits the prefix cache of another's) and its own request
ids; the figures are computed over every request of every process: TTFT and ITL percentiles over
the union, output tokens/s as the sum of output tokens over the span from the first request's send
to the last one's end. All stamps are ``time.perf_counter()`` (CLOCK_MONOTONIC), one clock for
every process on the host. K = 1 is computed the same way, so passes of any K compare.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any


def _pct(xs: list[float], q: float) -> float:
    """numpy's default (linear) percentile, as ``vllm bench serve`` reports them."""
    xs = sorted(xs)
    pos = q / 100 * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def command(model_dir: str, base: str, served: str, out: Path, name: str, prompts: int, conc: int,
            seed: int, ids: str | None, shape: tuple[str, ...] = ()) -> list[str]:
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "vllm",
           "--base-url", base, "--model", model_dir, "--served-model-name", served, "--tokenizer", model_dir,
           "--dataset-name", "random", "--random-input-len", "128", "--random-output-len", "128", "--ignore-eos",
           "--num-prompts", str(prompts), "--max-concurrency", str(conc), "--seed", str(seed), "--save-result",
           "--save-detailed", "--result-dir", str(out), "--result-filename", f"{name}.json",
           "--percentile-metrics", "ttft,itl,e2el"]
    return cmd + list(shape) + (["--request-id-prefix", ids] if ids is not None else [])


def shape_args(range_ratio: float, rate: float | None, clients: int) -> tuple[str, ...]:
    """Each client's share of the load's shape: lengths drawn in 128 × [1 - r, 1 + r] (so requests
    of one wave no longer all end on the same step), and an open loop of ``rate`` requests per
    second in all (Poisson arrivals, each client rate/K) instead of a closed one."""
    out = ("--random-range-ratio", str(range_ratio)) if range_ratio else ()
    return out + (("--request-rate", str(rate / clients)) if rate else ())


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One pass's figures from the detailed results of its client processes."""
    ttfts = [t for p in parts for t, e in zip(p["ttfts"], p["errors"], strict=False) if t and not e]
    itls = [x for p in parts for xs in p["itls"] for x in xs]
    # A request's latency: its TTFT + every gap after (vLLM 0.24 saves no latencies; this is how
    # the benchmark computes them), and its end: its send + that, per client process.
    lats = [[t + sum(i) for t, i in zip(p["ttfts"], p["itls"], strict=False)] for p in parts]
    ends = [[s + x for s, x in zip(p["start_times"], ls, strict=False)] for p, ls in zip(parts, lats, strict=True)]
    first = min(s for p in parts for s in p["start_times"])
    span = max(map(max, ends)) - first
    tokens = sum(p["total_output_tokens"] for p in parts)
    completed = sum(p["completed"] for p in parts)
    # Whether the pass held its concurrency: K processes each send a fixed number of prompts, so one
    # whose streams the server serves first runs out first, and the pass ends with fewer streams
    # than asked for. mean_in_flight: the requests outstanding, averaged over the span (their summed
    # latency ÷ the span); client_end_s: when each process's last request ended.
    return {"completed": completed, "total_output_tokens": tokens, "duration": span,
            "output_throughput": tokens / span, "request_throughput": completed / span,
            "mean_ttft_ms": statistics.fmean(ttfts) * 1000, "median_ttft_ms": _pct(ttfts, 50) * 1000,
            "p99_ttft_ms": _pct(ttfts, 99) * 1000, "mean_itl_ms": statistics.fmean(itls) * 1000,
            "median_itl_ms": _pct(itls, 50) * 1000, "p99_itl_ms": _pct(itls, 99) * 1000,
            "mean_in_flight": round(sum(map(sum, lats)) / span, 1),
            "client_end_s": [round(max(e) - first, 2) for e in ends]}


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far; None once it is gone."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


class _CpuSampler:
    """Each client's CPU seconds every 0.2 s on the monotonic clock, so that the share can be taken
    over the benchmark's own span (a client's start-up imports vLLM: seconds of CPU before it)."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.rows: list[tuple[float, list[float | None]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.rows.append((time.monotonic(), [cpu_seconds(p) for p in self.pids]))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def share(self, t0: float, t1: float) -> list[float | None]:
        """Per client: CPU seconds over wall seconds between its first and last sample within
        [t0, t1] (a client that finished early has no sample after its exit)."""
        out: list[float | None] = []
        for k in range(len(self.pids)):
            inside = [(t, c[k]) for t, c in self.rows if t0 <= t <= t1 and c[k] is not None]
            (ta, ca), (tb, cb) = (inside[0], inside[-1]) if len(inside) >= 2 else ((0.0, 0.0), (0.0, 0.0))
            out.append(round((cb - ca) / (tb - ta), 2) if tb > ta and ca is not None and cb is not None else None)
        return out


def run(model_dir: str, base: str, served: str, out: Path, tag: str, prompts: int, conc: int, clients: int,
        with_ids: bool, shape: tuple[str, ...] = ()) -> dict[str, Any]:
    """The merged figures, each client's CPU share over the pass, and (for trace_join.py) every
    request's id, send time and TTFT."""
    procs: list[tuple[str, subprocess.Popen[bytes]]] = []
    for k in range(clients):
        name = f"bench-{tag}-c{k}"
        cmd = command(model_dir, base, served, out, name, prompts // clients, conc // clients, k,
                      f"{tag}-c{k}-" if with_ids else None, shape)
        with open(out / f"{name}.txt", "wb") as log:
            procs.append((name, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)))
    cpu = _CpuSampler([p.pid for _, p in procs])
    try:
        for name, p in procs:
            if p.wait(timeout=300):
                raise RuntimeError(f"{name} exited {p.returncode}: {(out / f'{name}.txt').read_text()[-3000:]}")
    finally:
        cpu.stop()
        for _, p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    parts = []
    for name, _ in procs:
        path = out / f"{name}.json"
        parts.append(json.loads(path.read_text()))
        path.unlink()
    res = merge(parts)
    first = min(s for p in parts for s in p["start_times"])
    res["clients"] = clients
    res["client_cpu_share"] = cpu.share(first, first + res["duration"])
    res["ids"] = [f"{tag}-c{k}-{i}" for k, p in enumerate(parts) for i in range(len(p["ttfts"]))]
    res["start_times"] = [s for p in parts for s in p["start_times"]]
    res["ttfts"] = [t for p in parts for t in p["ttfts"]]
    return res
