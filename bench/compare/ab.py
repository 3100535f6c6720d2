"""Two trees' gateways (and their uvicorn floors) in turn under one load generator: CPU per request
at 64 concurrent, as run.py's ``conc`` phase, with the trees alternated pass by pass.

run.py measures one tree, and on the 2-core VM its figure moved by ±15 % between runs of the same
tree minutes apart, more than most changes to the request path. Here each pass measures every
server within seconds of the others, so a slow stretch of the host falls on all of them alike,
and the per-pass difference between the trees is what to read.

    .venv/bin/python bench/compare/ab.py BASE_TREE NEW_TREE [--passes 8] [--requests 20000] [--floor]
    .venv/bin/python bench/compare/ab.py BASE_TREE NEW_TREE --paced [--router]   # CPU per streamed event
    .venv/bin/python bench/compare/ab.py . . --paced --router --new-python /tmp/py3.13/bin/python  # interpreters

Each tree is a checkout (``git worktree add``) with its own ``gateway/``; the gateway starts there
as run.py starts it (targets.gateway's config), the floor as floor.py's, with that tree's protocol.
``--paced`` measures run.py's paced phase instead (256 streams of 100 events 20 ms apart, 3 rounds
each, after a warm-up): CPU µs per relayed event. ``--router`` adds vllm-router in front of the
same upstream, the per-event baseline, and prints each tree's ratio to it pass by pass.
``--base-python``/``--new-python`` run that side's gateway under another interpreter (a virtual
environment with the gateway's dependencies), to compare Python versions on one tree.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path

import loadgen
from floor import passes, start_floor
from run import PROXY_CPU, _run, side_upstream
from targets import ROOT, Proc, gateway, vllm_router


def paced_pass(p: Proc, url: str, _: int) -> tuple[tuple[float, float], loadgen.Result]:
    """run.py's paced phase against ``url``: ``p``'s user and system µs per relayed event. ``p`` is
    stopped after it, whatever happens."""
    try:
        _run(loadgen.streams(url, "paced", 64, 20, 1, 0.4, 30))  # connections open, caches warm
        u0, s0 = p.cpu_split()
        r = _run(loadgen.streams(url, "paced", 256, 100, 3, 2.0, 120))
        u1, s1 = p.cpu_split()
    finally:
        p.stop()
    return ((u1 - u0) / r.events * 1e6, (s1 - s0) / r.events * 1e6), r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("base", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--passes", type=int, default=8)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--floor", action="store_true", help="also each tree's uvicorn floor (floor.py's app)")
    ap.add_argument("--paced", action="store_true", help="CPU per event of paced streams, not per request")
    ap.add_argument("--router", action="store_true", help="also vllm-router, and each tree's ratio to it")
    ap.add_argument("--base-python", help="the interpreter for the base side's gateway (default: this one)")
    ap.add_argument("--new-python", help="the interpreter for the new side's gateway (default: this one)")
    a = ap.parse_args()
    work, upstream, up_url = side_upstream()
    kinds = ("gateway", "floor") if a.floor else ("gateway",)

    def start(kind: str, tree: Path, python: str | None) -> Callable[[], tuple[Proc, str]]:
        if kind == "gateway":
            launcher = (python, "-m", "gateway") if python else ()
            return lambda: gateway(work, up_url, PROXY_CPU, work, cwd=tree, launcher=launcher)[:2]
        return lambda: start_floor(work, tree=tree)

    starts = {f"{kind} {name}": start(kind, tree, python) for kind in kinds
              for name, tree, python in (("base", a.base.resolve(), a.base_python),
                                         ("new", a.new.resolve(), a.new_python))}
    if a.router:
        starts["vllm-router"] = lambda: vllm_router(work, up_url, PROXY_CPU, ROOT / "bench" / "results" / "venvs")[:2]
    try:
        seen = passes(starts, a.passes, a.requests, alternate=True,  # neither tree always goes first
                      **({"measure": paced_pass, "unit": "event"} if a.paced else {}))
    finally:
        upstream.stop()
    if a.router:
        for name in ("base", "new"):
            gw, router = seen[f"gateway {name}"], seen["vllm-router"]
            r = [(g[0] + g[1]) / (v[0] + v[1]) for g, v in zip(gw, router, strict=True)]
            print(f"gateway {name} / vllm-router per pass: {', '.join(f'{x:.2f}' for x in r)}; "
                  f"median {statistics.median(r):.2f}")
    for kind in kinds:
        d = [(n[0] + n[1]) - (b[0] + b[1]) for b, n in zip(seen[f"{kind} base"], seen[f"{kind} new"], strict=True)]
        du = [n[0] - b[0] for b, n in zip(seen[f"{kind} base"], seen[f"{kind} new"], strict=True)]
        print(f"{kind}, new - base per pass (all): {', '.join(f'{x:+.1f}' for x in d)}; "
              f"median {statistics.median(d):+.1f} µs (user {statistics.median(du):+.1f})")


if __name__ == "__main__":
    main()
