"""Sampled Python stacks of each instance's API server and engine core over a twin pass's window,
and the two sides set beside each other per unit of work (an engine step, a token).

Why: at 256 streams the 2.8 B model's engine core stepped slower on the gateway's side, CPU-bound,
its CPU per step moving between 17.9 and 29.6 ms from pass to pass on either side, and neither
placement nor waiting for a CPU explained it (results/twin-apart-h200x2). A profile of both sides'
processes in the same seconds says which code's time differs (results/twin-graphs-h200x2: none in
particular).

py-spy samples with ``--nonblocking``: it reads a process's memory without stopping it, so the
profiled engine runs as it would (at the price of a torn stack now and then, counted as errors).
Idle threads are left out (py-spy's default), so a frame's samples are time it was on a CPU, or
in a call py-spy does not know to be waiting. Each process's samples are folded into the pass's
row as it ends (frames whose inclusive share is at least ``KEEP``), so the rows file alone
carries them.

    python3 bench/gpu/prof.py ROWS.json[.gz]... [--top 20] [--proc engine|api] [--self]

prints each profiled pass's frames side by side, then for every pass with a gateway side (profiled
or not) each process's CPU a unit of work, gateway ÷ direct (``UNITS``: the engine core's a step,
the API server's a token its clients received).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from in_pass import instance
from twin_stats import _paths, load

RATE = 200  # samples a second: a 30 s window gives 6,000 of a process that is always busy
KEEP = 0.002  # frames under this share of a process's samples are dropped from the row
_LINE = re.compile(r":\d+\)$")  # a frame's line number: the same function from two lines is one frame


def exe() -> str | None:
    """py-spy: $PYSPY, on PATH, beside this Python (a venv's), or where twin_run.sh's header
    installs it on the device (/tmp/spy/bin)."""
    for c in (os.environ.get("PYSPY"), shutil.which("py-spy"), str(Path(sys.executable).parent / "py-spy"),
              "/tmp/spy/bin/py-spy"):
        if c and os.access(c, os.X_OK):
            return c
    return None


def record(pid: int, out: Path, delay: float, seconds: float,
           cpus: set[int] | None = None) -> subprocess.Popen[bytes] | None:
    """Start sampling ``pid`` ``delay`` s from now for ``seconds``, raw folded stacks to ``out``
    (its log beside it); py-spy on ``cpus`` if given. None without py-spy."""
    spy = exe()
    if spy is None:
        return None
    cmd = [spy, "record", "-p", str(pid), "-d", str(max(1, round(seconds))), "-r", str(RATE), "-f", "raw",
           "--nonblocking", "-o", str(out)]
    log = out.with_suffix(".log").open("wb")
    with log:
        return subprocess.Popen(["sh", "-c", f'sleep {max(0.0, delay):.3f}; exec "$@"', "sh", *cmd],
                                stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)


def stacks(path: Path) -> Counter[tuple[str, ...]]:
    """py-spy's raw output: ``frame;frame;... count`` a line, outermost first, lines dropped."""
    out: Counter[tuple[str, ...]] = Counter()
    for line in path.read_text().splitlines():
        head, _, count = line.rpartition(" ")
        if head and count.isdigit():
            out[tuple(_LINE.sub(")", f) for f in head.split(";"))] += int(count)
    return out


def fold(found: Counter[tuple[str, ...]], rate: int = RATE, keep: float = KEEP) -> dict[str, Any]:
    """A process's samples as the row keeps them: the total, and per frame the samples it was on
    the stack (``inclusive``) and on top of it (``self``), frames under ``keep`` of the total left out."""
    total = sum(found.values())
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for stack, n in found.items():
        for f in set(stack):
            inclusive[f] += n
        own[stack[-1]] += n
    floor = keep * total
    return {"rate": rate, "samples": total,
            "inclusive": {f: n for f, n in inclusive.most_common() if n >= floor},
            "self": {f: n for f, n in own.most_common() if n >= floor}}


def collect(spies: dict[str, dict[str, tuple[subprocess.Popen[bytes], Path]]],
            timeout: float = 60.0) -> dict[str, dict[str, Any]]:
    """Wait for each py-spy (instance -> process -> (its py-spy, its output)) and fold what it wrote;
    a process whose sampling failed gets its log's last line instead."""
    out: dict[str, dict[str, Any]] = {}
    for name, procs in spies.items():
        for proc, (spy, path) in procs.items():
            try:
                spy.wait(timeout)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait()
            if path.exists() and path.stat().st_size:
                out.setdefault(name, {})[proc] = fold(stacks(path))
            else:
                log = path.with_suffix(".log")
                tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
                out.setdefault(name, {})[proc] = {"error": tail[0] if tail else f"py-spy exited {spy.returncode}"}
    return out


def shares(folded: dict[str, Any], cpu: float, key: str = "inclusive") -> dict[str, float]:
    """Each frame's share of the process's samples times ``cpu``, the process's CPU a unit of work
    measured apart from the profile (py-spy falls behind its rate on deep stacks)."""
    return {f: cpu * n / folded["samples"] for f, n in folded[key].items()}


# Each process's unit of work: the engine core's CPU a step (in_pass.engine), the API server's a
# token its clients received (its HTTP, detokenizing and output processing run per token).
UNITS = {"engine": ("ms of CPU a step", "steps_per_s", 1e3), "api": ("µs of CPU a token", "output_throughput", 1e6)}


def per_unit(row: dict[str, Any], path: str, proc: str) -> float | None:
    """``path``'s ``proc`` CPU a unit of work (``UNITS``) over the pass's window, from in_pass's
    figures alone (older rows without a profile have them too); None where they are missing."""
    _, rate_key, scale = UNITS[proc]
    eng = (row.get("engine") or {}).get(path) or {}
    rate = eng.get(rate_key) or row["sides"][path].get(rate_key)
    return eng[f"{proc}_cpu"] * scale / rate if rate and eng.get(f"{proc}_cpu") else None


def ratios(rows: list[dict[str, Any]], proc: str) -> str:
    """Each gateway pass's ``proc`` CPU a unit of work, gateway side ÷ direct side, and their median."""
    found = []
    for row in rows:
        gateway, direct = _paths(row)
        if gateway and direct and gateway.startswith("gateway") and None not in (
                units := [per_unit(row, p, proc) for p in (gateway, direct)]):
            found.append(units[0] / units[1])  # type: ignore[operator]
    if not found:
        return f"{proc}: no pass with both sides' figures"
    return (f"{proc}, {UNITS[proc][0]}, gateway ÷ direct, each pass: {', '.join(f'{r:.3f}' for r in found)} "
            f"(median {statistics.median(found):.3f}; above 1 in {sum(r > 1 for r in found)} of {len(found)})")


def compare(row: dict[str, Any], proc: str = "engine", top: int = 20, key: str = "inclusive") -> str:
    """One pass: each side's ``proc`` frames in CPU a unit of work (``UNITS``), the ``top`` by the
    larger side, and their difference."""
    cols: list[tuple[str, dict[str, float], float]] = []
    for path in row["sides"]:
        folded = row.get("prof", {}).get(instance(path), {}).get(proc)
        cpu = per_unit(row, path, proc)
        if not folded or "error" in folded or cpu is None:
            return f"pass {row['pass']}: no {proc} profile of {path} ({(folded or {}).get('error', 'none')})"
        cols.append((path, shares(folded, cpu, key), cpu))
    (pa, a, ta), (pb, b, tb) = cols
    lines = [f"pass {row['pass']} ({row['kind']}), {proc}, {key}, {UNITS[proc][0]}: {pa} | {pb} | difference",
             f"  the process's CPU: {ta:.2f} | {tb:.2f} | {tb - ta:+.2f}"]
    for f in sorted(set(a) | set(b), key=lambda f: -max(a.get(f, 0.0), b.get(f, 0.0)))[:top]:
        x, y = a.get(f, 0.0), b.get(f, 0.0)
        lines.append(f"  {f}: {x:.2f} | {y:.2f} | {y - x:+.2f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("rows", nargs="+")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--proc", choices=["engine", "api"], default="engine")
    ap.add_argument("--self", action="store_true", help="frames on top of the stack, not anywhere in it")
    a = ap.parse_args()
    rows = load(a.rows)
    for row in rows:
        if "prof" in row:
            print(compare(row, a.proc, a.top, "self" if a.self else "inclusive"), end="\n\n")
    for proc in UNITS:
        print(ratios(rows, proc))


if __name__ == "__main__":
    main()
