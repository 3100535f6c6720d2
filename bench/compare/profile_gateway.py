"""Where the gateway spends its CPU: py-spy on the gateway while the benchmark's load runs.

Same placement as run.py (gateway on CPU 0; upstream, load generator and py-spy on CPU 1).
Writes bench/results/profile-<phase>.txt (collapsed stacks) and prints the top frames by self
time and by inclusive time. py-spy comes from PyPI into bench/results/venvs/py-spy.

``--perf`` samples with Linux perf instead (needs perf and root) and prints the gateway's CPU by
shared object: the kernel, CPython itself, uvloop, httptools. py-spy cannot split those (a sample
in the C loop or in a C call lands on the Python frame that made it); perf cannot name Python
functions. Together they say whether the cost is in the kernel or in the interpreter.

    .venv/bin/python bench/compare/profile_gateway.py [--phase paced|conc|burst] [--seconds 8] [--perf]
"""

from __future__ import annotations

import argparse
import collections
import subprocess
from collections.abc import Callable
from pathlib import Path

import loadgen
from run import _run, upstream_and_gateway
from targets import ROOT, ensure_venv


def load(url: str, phase: str, seconds: float, token_ms: float) -> loadgen.Result:
    if phase == "conc":
        return _run(loadgen.requests(url, 10**6, 64, seconds))
    if phase == "burst":
        return _run(loadgen.streams(url, "m", 64, 200, 10**6, 0.0, seconds))
    tokens = 100
    return _run(loadgen.streams(url, "paced", 256, tokens, 10**6, tokens * token_ms / 1000, seconds))


def top(collapsed: Path, n: int = 25) -> str:
    self_t: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        c = int(count)
        total += c
        frames = stack.split(";")
        self_t[frames[-1]] += c
        for f in set(frames):
            incl[f] += c
    out = [f"{total} samples", "", "self %  frame"]
    out += [f"{100 * c / total:5.1f}  {f}" for f, c in self_t.most_common(n)]
    out += ["", "incl %  frame"]
    out += [f"{100 * c / total:5.1f}  {f}" for f, c in incl.most_common(n)]
    return "\n".join(out)


OUT = ROOT / "bench" / "results"


Sampled = tuple[loadgen.Result, float, float, subprocess.Popen[str], str]


def sampled(phase: str, seconds: float, sampler: Callable[[int], subprocess.Popen[str]]) -> Sampled:
    """``phase``'s load on the gateway with ``sampler(pid)`` started on it after the warm-up: the
    load's result, the gateway's user and system seconds over it, the sampler once it has ended
    (before the gateway stops) and what it wrote to a piped stderr."""
    work = OUT / "compare-work"
    work.mkdir(parents=True, exist_ok=True)
    with upstream_and_gateway(work, 20.0) as (gw, url, _):
        _run(loadgen.streams(url, "m", 256, 4, 1, 0.0, 30))  # open connections before sampling
        proc = sampler(gw.pid)
        u0, s0 = gw.cpu_split()
        res = load(url, phase, seconds, 20.0)
        u1, s1 = gw.cpu_split()
        _, err = proc.communicate(timeout=120)
    return res, u1 - u0, s1 - s0, proc, err or ""


def by_object(phase: str, seconds: float) -> None:
    """``perf record`` on the gateway under ``phase``'s load; its samples by shared object."""
    data = OUT / f"perf-{phase}.data"
    res, user, system, _, _ = sampled(phase, seconds, lambda pid: subprocess.Popen(
        ["perf", "record", "-F", "2000", "-p", str(pid), "-o", str(data), "--", "sleep", str(int(seconds))],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True))
    n = max(res.events or res.done, 1)
    print(f"{phase}: {n} {'events' if res.events else 'requests'}, gateway user {user / n * 1e6:.1f} µs, "
          f"system {system / n * 1e6:.1f} µs each (perf attached)")
    report = subprocess.run(["perf", "report", "-i", str(data), "--sort", "dso", "--stdio", "-q"],
                            capture_output=True, text=True, check=True).stdout
    print("\n".join(line.rstrip() for line in report.splitlines() if line.strip())[:2000])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase", choices=("paced", "conc", "burst"), default="paced")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--native", action="store_true", help="include C frames (slower sampling)")
    ap.add_argument("--perf", action="store_true", help="perf's split by shared object instead of py-spy")
    a = ap.parse_args()
    if a.perf:
        return by_object(a.phase, a.seconds)
    spy = ensure_venv(OUT / "venvs", "py-spy", "py-spy", "py-spy")
    collapsed = OUT / f"profile-{a.phase}.txt"
    argv = [str(spy), "record", "-d", str(int(a.seconds)), "-r", "200", "-f", "raw",
            "-o", str(collapsed)] + (["--native"] if a.native else ["--nonblocking"])
    collapsed.unlink(missing_ok=True)
    res, user, system, spy_proc, err = sampled(a.phase, a.seconds, lambda pid: subprocess.Popen(
        [*argv, "-p", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    if not collapsed.exists():
        raise SystemExit(f"py-spy failed ({spy_proc.returncode}): {err.strip()[-500:]}")
    n = res.events or res.done
    print(f"{a.phase}: {n} {'events' if res.events else 'requests'}, gateway CPU {user + system:.2f} s "
          f"= {(user + system) / max(n, 1) * 1e6:.1f} µs each (py-spy attached, so a little higher than run.py)")
    print(top(collapsed))


if __name__ == "__main__":
    main()
