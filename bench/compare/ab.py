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
from pathlib import Path

from floor import one_pass, start_floor
from run import PROXY_CPU, side_upstream
from targets import gateway


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("base", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--passes", type=int, default=8)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--floor", action="store_true", help="also each tree's uvicorn floor (floor.py's app)")
    a = ap.parse_args()
    work, upstream, up_url = side_upstream()
    runs = [(f"{kind} {name}", tree, kind) for kind in (("gateway", "floor") if a.floor else ("gateway",))
            for name, tree in (("base", a.base.resolve()), ("new", a.new.resolve()))]
    seen: dict[str, list[tuple[float, float]]] = {label: [] for label, _, _ in runs}
    try:
        for i in range(a.passes):
            for label, tree, kind in runs if i % 2 == 0 else runs[::-1]:  # neither tree always goes first
                p, url = (gateway(work, up_url, PROXY_CPU, work, cwd=tree)[:2] if kind == "gateway"
                          else start_floor(work, tree=tree))
                cpu, r = one_pass(p, url, a.requests)
                seen[label].append(cpu)
                print(f"pass {i + 1}, {label}: {r.done} requests, {r.errors} errors, user {seen[label][-1][0]:.1f} µs, "
                      f"system {seen[label][-1][1]:.1f} µs per request", flush=True)
    finally:
        upstream.stop()
    for label, xs in seen.items():
        print(f"{label}: median user {statistics.median(u for u, _ in xs):.1f}, system "
              f"{statistics.median(s for _, s in xs):.1f}, all {statistics.median(u + s for u, s in xs):.1f} µs per "
              f"request ({len(xs)} passes)")
    for kind in {k for _, _, k in runs}:
        d = [(n[0] + n[1]) - (b[0] + b[1]) for b, n in zip(seen[f"{kind} base"], seen[f"{kind} new"], strict=True)]
        du = [n[0] - b[0] for b, n in zip(seen[f"{kind} base"], seen[f"{kind} new"], strict=True)]
        print(f"{kind}, new - base per pass (all): {', '.join(f'{x:+.1f}' for x in d)}; "
              f"median {statistics.median(d):+.1f} µs (user {statistics.median(du):+.1f})")


if __name__ == "__main__":
    main()
