"""What twin_pairs.py's pinned passes and in_pass.py's CPU and GPU figures rest on: each
instance's engine core loop moved onto a CPU of its own and back (pin.py), the CPU a process and
its descendants used and the time their threads waited for a CPU, and how twin_stats.py reports
passes with the engines apart."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.bench_gpu import RESULTS
from tests.support.bench_gpu import load as _load

# a process that starts one child burning a CPU and sleeps: an API server and its engine core
_BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\ntime.sleep(60)"
_PARENT = ("import subprocess, sys, time\n"
           "subprocess.Popen([sys.executable, '-c', sys.argv[1]])\n"
           "time.sleep(60)")


def _family(burn_s: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", _PARENT, _BURN.format(s=burn_s)])


def _children(pid: int, deadline_s: float = 20.0) -> list[int]:
    in_pass = _load("in_pass")
    deadline = time.monotonic() + deadline_s
    while not (kids := in_pass.descendants(pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return kids


def _affinity(pid: int) -> dict[int, set[int]]:
    return {int(t): os.sched_getaffinity(int(t)) for t in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs: one for the engine, one for the rest")
def test_a_pinned_pass_gives_the_engine_loop_a_cpu_of_its_own_and_a_plain_one_puts_it_back(tmp_path: Path) -> None:
    twin = _load("twin_pairs")
    api = _family(0.5)
    try:
        [engine] = _children(api.pid)
        time.sleep(0.6)  # the child's thread has the most CPU time by now
        mine = sorted(os.sched_getaffinity(0))
        pinned = twin.place(tmp_path, {"a": api.pid}, apart=True)
        assert pinned is not None
        assert pinned["a"] == {"pid": engine, "tid": engine, "cpu": mine[-1]}, pinned
        assert pinned["rest"] == mine[:-1]
        assert _affinity(engine)[engine] == {mine[-1]}
        assert all(cpus == set(mine[:-1]) for cpus in _affinity(api.pid).values())
        # the CPUs `up` gave them are kept from the first pass on; a plain pass restores them
        assert twin.place(tmp_path, {"a": api.pid}, apart=False) is None
        assert all(cpus == set(mine) for pid in (api.pid, engine) for cpus in _affinity(pid).values())
    finally:
        for pid in _children(api.pid, 0):
            os.kill(pid, 9)
        api.kill()
        api.wait()


def test_processes_count_the_cpu_of_the_descendants_apart() -> None:
    in_pass = _load("in_pass")
    child = subprocess.Popen([sys.executable, "-c", _BURN.format(s=0.3)])
    try:
        deadline = time.monotonic() + 20
        while (cpu := in_pass.processes(os.getpid())[:2])[1] < 0.25 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert cpu[1] >= 0.25 and cpu[0] > 0, cpu
    finally:
        child.kill()
        child.wait()
    assert in_pass.processes(None) == [-1.0, -1.0, -1.0, -1.0]


def test_the_run_delay_counts_a_descendant_that_waited_for_a_cpu() -> None:
    """Two burners held to one CPU: each waits while the other runs, and that is counted below
    the parent whose descendants they are, not for the parent itself."""
    in_pass = _load("in_pass")
    cpu = min(os.sched_getaffinity(0))
    burn = _BURN.format(s=0.4)
    kids = [subprocess.Popen([sys.executable, "-c", burn], preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
            for _ in range(2)]
    # From here on: the parent's own delay is counted from its start, so earlier tests in this
    # process that kept it waiting for a CPU would otherwise count against it.
    before = in_pass.processes(os.getpid())[2:]
    try:
        deadline = time.monotonic() + 30
        while ((wait := [w - b for w, b in zip(in_pass.processes(os.getpid())[2:], before, strict=True)])[1] < 0.2
               and time.monotonic() < deadline):
            time.sleep(0.1)
        assert wait[1] >= 0.2 and wait[0] < wait[1], wait
    finally:
        for k in kids:
            k.kill()
            k.wait()


def test_engine_gives_the_waits_as_shares_of_a_cpu_and_the_gpu_as_means() -> None:
    in_pass = _load("in_pass")

    def row(t: float, n: float, busy: float) -> list[float]:
        # [t, 4 gauges, 4 clocks' sums and counts, steps' sum and count, CPU and wait of both, GPU]
        return [t, 1, 0, 0, 0, *[0.0] * 8, 100 * n, n, n, 2 * n, n / 10, n / 5, busy, 1980.0, 500.0]

    rows = [row(6.0, 0, 90.0), row(7.0, 10, 100.0), row(8.0, 20, -1.0)]
    assert in_pass.engine(rows, 6.0, 9.0) == {
        "steps_per_s": 10.0, "tokens_per_step": 100.0, "api_cpu": 10.0, "engine_cpu": 20.0, "api_wait": 1.0,
        "engine_wait": 2.0, "gpu_busy_pct": 95.0, "sm_mhz": 1980.0, "power_w": 500.0}  # -1: not read
    assert in_pass.Gpus().figures(None) == [-1.0, -1.0, -1.0]


def _eng(steps: float, wait: float, busy: float) -> dict[str, Any]:
    return {"steps_per_s": steps, "tokens_per_step": 450.0, "api_cpu": 0.8, "engine_cpu": 1.02, "api_wait": 0.01,
            "engine_wait": wait, "gpu_busy_pct": busy, "sm_mhz": 1980.0, "power_w": 400.0}


def _gb(n: int, ratio: float, pin: dict[str, Any] | None) -> dict[str, Any]:
    kind = "gb" if n % 2 == 0 else "ga"
    direct, gateway = ("direct:a", "gateway:b") if kind == "gb" else ("direct:b", "gateway:a")
    row = {"conc": 256, "pass": n, "kind": kind, "queued": 0,
           "sides": {direct: {"output_throughput": 100.0}, gateway: {"output_throughput": 100.0 * ratio}},
           "engine": {direct: _eng(40.0, 0.002, 80.0), gateway: _eng(40.0 * ratio, 0.05, 70.0)}}
    return {**row, "pin": pin} if pin else row


def test_passes_with_the_engines_apart_pair_among_themselves() -> None:
    stats = _load("twin_stats")
    pin = {"rest": [0, 1], "a": {"pid": 7, "tid": 7, "cpu": 2}, "b": {"pid": 9, "tid": 9, "cpu": 3}}
    rows = [_gb(0, 0.9, None), _gb(1, 0.9, None), _gb(2, 1.0, pin), _gb(3, 1.0, pin)]
    out = stats.report(rows)
    plain, apart = out.split("each engine core loop on a CPU of its own")
    assert "| tokens/s | 0.900 (0.900–0.900), 0 of 1 |" in plain
    assert "| tokens/s | 1.000 (1.000–1.000), 0 of 1 |" in apart
    # each side's engine: where its loop ran, what it used and waited, its GPU and its ms a step
    assert "| 0 | gb | — | gateway:b | 1.02 | 0.05 | 0.8 | 0.01 | 70.0 | 1980 | 400 | 19.4 |" in plain
    assert "| 3 | ga | 2 | gateway:a | 1.02 | 0.05 | 0.8 | 0.01 | 70.0 | 1980 | 400 | 17.5 |" in apart
    assert "| 2 | gb | 2 | direct:a | 1.02 | 0.002 | 0.8 | 0.01 | 80.0 | 1980 | 400 | 20.0 |" in apart


APART = [f"twin-apart-h200x2/rows-{k}.json.gz" for k in (1, 2, 3)]


def _rows(files: list[str]) -> list[dict[str, Any]]:
    return _load("twin_stats").load([str(RESULTS / f) for f in files])


def test_the_apart_write_up_matches_its_rows() -> None:
    """twin-apart-h200x2's README, bench/README and the README quote these figures."""
    stats = _load("twin_stats")
    out = stats.report(_rows(APART))
    plain, apart = out.split("each engine core loop on a CPU of its own")
    for line in ("| tokens/s | 0.987 (0.863–1.042), 2 of 4 |", "| TTFT p50 | 1.004 (0.902–1.073), 2 of 4 |",
                 "gateway ÷ direct, each pass: 0.741, 0.976, 0.974, 1.060, 0.993, 0.967, 0.998, 1.083 (median 0.984)."):
        assert line in plain
    for line in ("| tokens/s | 0.984 (0.933–1.084), 1 of 3 | 1.042 1.050 0.870 / 0.930 1.119 1.000 |",
                 "| TTFT p50 | 0.918 (0.905–0.939), 0 of 3 |",
                 "gateway ÷ direct, each pass: 1.068, 0.855, 0.988, 1.163, 0.839, 1.009 (median 0.998).",
                 "| 2 | gb | 27 | direct:a |", "| 2 | gb | 28 | gateway:b |"):
        assert line in apart
    every = stats.report(_rows(["twin-2b8-h200x2/rows.json.gz", "twin-2b8-h200x2/rows-engine.json.gz", *APART]))
    assert "| tokens/s | 0.966 (0.925–1.002), 2 of 7 |" in every
    assert "| TTFT p50 | 0.978 (0.876–1.073), 3 of 7 |" in every
    # every side of every pass: the CPU and GPU ranges the write-up gives
    engines = [e for r in _rows(APART) for e in r["engine"].values()]
    assert len(engines) == 28
    assert max(max(e["engine_wait"], e["api_wait"]) for e in engines) < 0.0005
    assert (min(e["engine_cpu"] for e in engines), max(e["engine_cpu"] for e in engines)) == (0.999, 1.034)
    assert (min(e["gpu_busy_pct"] for e in engines), max(e["gpu_busy_pct"] for e in engines)) == (24.2, 46.7)
    per_step = [e["engine_cpu"] / e["steps_per_s"] * 1000 for e in engines]
    assert (round(min(per_step), 1), round(max(per_step), 1)) == (17.9, 29.6)


def test_which_side_held_more_requests_and_stepped_slower() -> None:
    """The write-up's 16 passes at 256 with the engine figures: the gateway side held more
    requests in its engine in 12, and its running ratio and steps ratio go opposite ways."""
    import math
    import statistics

    in_pass, stats = _load("in_pass"), _load("twin_stats")
    running, steps, tokens, more = [], [], [], 0
    for r in _rows(["twin-2b8-h200x2/rows-engine.json.gz", *APART]):
        num, den = stats._paths(r)
        t = r["timing"]
        mean = {p: statistics.fmean(q[1] for q in in_pass.in_window(r["samples"][in_pass.instance(p)], t["warmup"],
                                                                     t["warmup"] + t["window"])) for p in (num, den)}
        e = r["engine"]
        running.append(math.log(mean[num] / mean[den]))
        steps.append(math.log(e[num]["steps_per_s"] / e[den]["steps_per_s"]))
        tokens.append(math.log(e[num]["tokens_per_step"] / e[den]["tokens_per_step"]))
        more += mean[num] > mean[den]
    assert (len(steps), more) == (16, 12)
    assert round(statistics.correlation(running, steps), 2) == -0.55
    assert round(statistics.correlation(tokens, steps), 2) == -0.50
