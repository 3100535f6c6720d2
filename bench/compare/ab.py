"""Two trees' gateways (and their uvicorn floors) in turn under one load generator: CPU per request
at 64 concurrent, as run.py's ``conc`` phase, with the trees alternated pass by pass.

run.py measures one tree, and on the 2-core VM its figure moved by ±15 % between runs of the same
tree minutes apart, more than most changes to the request path. Here each pass measures every
server within seconds of the others, so a slow stretch of the host falls on all of them alike,
and the per-pass difference between the trees is what to read.

    .venv/bin/python bench/compare/ab.py BASE_TREE NEW_TREE [--passes 8] [--requests 20000] [--floor]

Each tree is a checkout (``git worktree add``) with its own ``gateway/``; the gateway starts there
as run.py starts it (targets.gateway's config), the floor as floor.py's, with that tree's protocol.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path

from floor import passes, start_floor
from run import PROXY_CPU, side_upstream
from targets import Proc, gateway


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("base", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--passes", type=int, default=8)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--floor", action="store_true", help="also each tree's uvicorn floor (floor.py's app)")
    a = ap.parse_args()
    work, upstream, up_url = side_upstream()
    kinds = ("gateway", "floor") if a.floor else ("gateway",)

    def start(kind: str, tree: Path) -> Callable[[], tuple[Proc, str]]:
        if kind == "gateway":
            return lambda: gateway(work, up_url, PROXY_CPU, work, cwd=tree)[:2]
        return lambda: start_floor(work, tree=tree)

    starts = {f"{kind} {name}": start(kind, tree) for kind in kinds
              for name, tree in (("base", a.base.resolve()), ("new", a.new.resolve()))}
    try:
        seen = passes(starts, a.passes, a.requests, alternate=True)  # neither tree always goes first
    finally:
        upstream.stop()
    for kind in kinds:
        d = [(n[0] + n[1]) - (b[0] + b[1]) for b, n in zip(seen[f"{kind} base"], seen[f"{kind} new"], strict=True)]
        du = [n[0] - b[0] for b, n in zip(seen[f"{kind} base"], seen[f"{kind} new"], strict=True)]
        print(f"{kind}, new - base per pass (all): {', '.join(f'{x:+.1f}' for x in d)}; "
              f"median {statistics.median(d):+.1f} µs (user {statistics.median(du):+.1f})")


if __name__ == "__main__":
    main()
