"""Which API server process carries the gateway's streams when a backend runs several on one socket.

``vllm serve --api-server-count 2`` runs two API server processes on one shared listening socket;
each connection stays with the process that accepted it. On two H200s
(bench/gpu/results/twin-api2-split-h200x2) the gateway's busy connections to one instance sat
499 / 3 on its two API servers while its pool held 510 / 487, and that instance's engine ran a
fifth of its usual tokens a step. Direct clients, whose connections are fixed for a pass, never
went past 67 / 33. The suspect is the pool's pick: the most recently used idle connection (LIFO)
is the one a stream just released, so a closed loop keeps reusing the hottest connections,
whatever their split, and the rest of the pool, whatever its split, waits unused.

This measures it without GPUs: the fake upstream (upstream.py ``--shared 2``: two processes on one
listening socket, paced streams) behind each tree's gateway with a warm pool of twice the load
(as ``up`` sets it at 512 streams: 1,024), a closed loop of ``--conc`` streams through it in
``--rounds`` rounds, each cut off with its streams in flight (as each GPU pass ended). Per round:
the busier upstream process's share of the bytes sent to the gateway (the kernel's tcp_info,
bench/gpu/api_split.py) and its share of the pool as the round began. Trees alternate pass by
pass (base, new, new, base, ...), each pass on a fresh upstream and gateway.

    .venv/bin/python bench/compare/shared_accept.py BASE_TREE NEW_TREE [--passes 3] [--rounds 3] [--seconds 15]
    .venv/bin/python bench/compare/shared_accept.py --accepts 32 [--passes 3]   # how idle accepts split

A pick that spreads requests over the pool keeps the bytes' share at the pool's; one that does not
lets it run ahead; one that picks the least busy process holds it at an even share (0.50 with two),
whatever the pool's split, while each holds idle connections.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import importlib
import socket
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import loadgen
from run import PROXY_CPU, SIDE_CPU
from targets import ROOT, Proc, gateway

from tests.support.procs import free_port

HERE = Path(__file__).resolve().parent


def _gpu_module(name: str) -> ModuleType:
    """bench/gpu's ``name``: its scripts import each other by bare name, so their folder goes on
    the path for the import only."""
    sys.path.insert(0, str(ROOT / "bench" / "gpu"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "bench" / "gpu"))


def _round(before: dict[str, Any], after: dict[str, Any], seconds: float, roles: dict[int, str]) -> dict[str, Any]:
    """Over one round: the busier process's share of what the upstream sent the gateway, its share
    of the gateway's connections (the pool) as the round began, and how many of them had carried a
    byte in the last 2 s at the round's end (the pick's working set)."""
    window = _gpu_module("api_split").window
    servers = window(before, after, seconds, roles)["instances"]["up"]["servers"]
    pool = window(before, before, seconds, roles)["instances"]["up"]["servers"]  # as the round began
    sent = [d.get("gateway", {}).get("sent_mb", 0.0) for d in servers.values()]
    held = [pool.get(pid, {}).get("gateway", {}).get("conns", 0) for pid in servers]
    busier = max(range(len(sent)), key=sent.__getitem__) if sent else 0
    return {"share": round(sent[busier] / sum(sent), 3) if sum(sent) else None,
            "pool_share": round(held[busier] / sum(held), 3) if sum(held) else None, "held": held,
            "active": sum(d.get("gateway", {}).get("active", 0) for d in servers.values())}


async def _load(url: str, port: int, pid: int, a: argparse.Namespace) -> tuple[loadgen.Result, tuple[Any, Any, float]]:
    """A round of load, with the snapshots taken 1 s into it and 2 s before its cut: after the cut
    the connections that carried it are gone (aborted), and their bytes with them."""
    loop, snapshot = asyncio.get_running_loop(), _gpu_module("api_split").snapshot
    load = asyncio.ensure_future(loadgen.streams(url, "paced", a.conc, a.tokens, 10**6, 1.0, a.seconds))
    await asyncio.sleep(1.0)
    before = await loop.run_in_executor(None, snapshot, {"up": port}, {"up": pid})
    t0 = time.monotonic()
    await asyncio.sleep(a.seconds - 3.0)
    after = await loop.run_in_executor(None, snapshot, {"up": port}, {"up": pid})
    return await load, (before, after, time.monotonic() - t0)


def one_pass(tree: Path, work: Path, a: argparse.Namespace) -> dict[str, Any]:
    """Fresh upstream and gateway; ``--rounds`` rounds of load, each cut off with its streams in
    flight (their connections aborted, as a client going away does, and as each GPU pass ended),
    ``--gap`` seconds apart so that the pool is topped up in between."""
    port = free_port()
    up = Proc("upstream", [sys.executable, str(HERE / "upstream.py"), "--port", str(port), "--token-ms",
                           str(a.token_ms), "--shared", "2"], work / "upstream.log", SIDE_CPU)
    gw = None
    try:
        up_url = f"http://127.0.0.1:{port}"
        up.wait_http(up_url + "/health", 20)
        gw, url, _ = gateway(work, up_url, PROXY_CPU, work, cwd=tree,
                             env={"FLEET_UPSTREAM_WARM": "true", "FLEET_BACKEND_MAX_CONCURRENCY": str(2 * a.conc),
                                  "FLEET_HEALTH_INTERVAL_S": str(a.gap / 2)})
        roles = {p: "gateway" for p in [gw.pid, *_gpu_module("in_pass").descendants(gw.pid)]}
        rounds, errors = [], 0
        for _ in range(a.rounds):
            time.sleep(a.gap)  # the pool opens, or is topped up after the last round's aborts
            res, (before, after, span) = asyncio.run(_load(url, port, up.pid, a))
            rounds.append(_round(before, after, span, roles))
            errors += res.errors
        return {"tree": str(tree), "rounds": rounds, "errors": errors}
    finally:
        if gw is not None:
            gw.stop()
        up.stop()


def accepts(work: Path, n: int, repeats: int) -> None:
    """How the accepts alone split: ``n`` connections to the two idle upstream processes opened at
    once (non-blocking connects in a row), then one at a time with no gap, 5 ms and 50 ms apart;
    each held until counted, then closed."""
    port = free_port()
    up = Proc("upstream", [sys.executable, str(HERE / "upstream.py"), "--port", str(port), "--shared", "2"],
              work / "upstream.log", SIDE_CPU)
    snapshot = _gpu_module("api_split").snapshot
    try:
        up.wait_http(f"http://127.0.0.1:{port}/health", 20)
        for label, gap in (("at once", None), ("one at a time", 0.0), ("5 ms apart", 0.005), ("50 ms apart", 0.05)):
            splits = []
            for _ in range(repeats):
                socks = []
                for _ in range(n):
                    if gap is None:
                        s = socket.socket()
                        s.setblocking(False)
                        with contextlib.suppress(BlockingIOError):
                            s.connect(("127.0.0.1", port))
                    else:
                        s = socket.create_connection(("127.0.0.1", port))
                        time.sleep(gap)
                    socks.append(s)
                time.sleep(0.3)  # every accept done
                conns = snapshot({"up": port}, {"up": up.pid})["conns"]["up"].values()
                held = sorted(collections.Counter(c[0] for c in conns).values(), reverse=True)
                splits.append(" / ".join(str(h) for h in [*held, 0][:2]))
                for s in socks:
                    s.close()
                time.sleep(0.3)
            print(f"{n} connections {label}: {', '.join(splits)}", flush=True)
    finally:
        up.stop()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("base", type=Path, nargs="?", default=ROOT)
    ap.add_argument("new", type=Path, nargs="?", default=ROOT)
    ap.add_argument("--passes", type=int, default=3, help="per tree")
    ap.add_argument("--seconds", type=float, default=15.0, help="a round's load")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gap", type=float, default=6.0, help="seconds before each round")
    ap.add_argument("--conc", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=16, help="events a stream, --token-ms apart")
    ap.add_argument("--token-ms", type=float, default=20.0)
    ap.add_argument("--accepts", type=int, default=0,
                    help="only how this many connections split between the idle processes (no trees)")
    a = ap.parse_args(argv)
    work = ROOT / "bench" / "results" / "shared-accept"
    work.mkdir(parents=True, exist_ok=True)
    if a.accepts:
        return accepts(work, a.accepts, a.passes)
    order = [("base", "new"), ("new", "base")]
    rows: dict[str, list[dict[str, Any]]] = {"base": [], "new": []}
    for n in range(a.passes):
        for name in order[n % 2]:
            row = one_pass(getattr(a, name).resolve(), work, a)
            rows[name].append(row)
            print(f"pass {n} {name}: by round, the busier process's share of bytes / of the pool "
                  + ", ".join(f"{r['share']} / {r['pool_share']}" for r in row["rounds"])
                  + f"; {row['errors']} errors", flush=True)
    print("\n| tree | rounds | busier process's share of the bytes: median (range) | its share of the pool | "
          "bytes minus pool: median (range), rounds above 0 | connections active at the end |")
    print("|---|---|---|---|---|---|")
    for name in ("base", "new"):
        got = [r for row in rows[name] for r in row["rounds"] if r["share"] is not None]
        share, pool = [r["share"] for r in got], [r["pool_share"] for r in got]
        diff = [s - p for s, p in zip(share, pool, strict=True)]
        active = [r["active"] for r in got]
        print(f"| {name} | {len(got)} | {statistics.median(share):.2f} ({min(share):.2f}–{max(share):.2f}) | "
              f"{statistics.median(pool):.2f} ({min(pool):.2f}–{max(pool):.2f}) | "
              f"{statistics.median(diff):+.2f} ({min(diff):+.2f} to {max(diff):+.2f}), {sum(d > 0 for d in diff)} | "
              f"{statistics.median(active):.0f} ({min(active)}–{max(active)}) |")


if __name__ == "__main__":
    main()
