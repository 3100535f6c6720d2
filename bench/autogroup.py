"""Does a CPU fleet starve its own gateway? The real supervisor, gateway and two CPU vLLM instances
of the tiny model, with every child in a session of its own (as the supervisor started them until
2026-11-28) against a process group of its own in the supervisor's session (as it starts them now),
passes alternated.

Why sessions matter: with the kernel's autogroup (``/proc/sys/kernel/sched_autogroup_enabled``, on
by default in most distributions) each session is a scheduling group. The baseline runs the same
supervisor with its children's ``process_group=0`` swapped for ``start_new_session=True`` (a patch
of ``asyncio.create_subprocess_exec`` in the supervisor's process; nothing else changes).

Each pass starts the fleet (the product's health probe settings, or with ``--probes short`` the
console test's), then a client in a session of its own (as a browser or a remote client is)
streams ``--requests`` chat completions of ``--tokens`` tokens through the gateway, one after the
other, alternating the two models (``ignore_eos``).
Per pass: the share of the run the gateway's and the supervisor's main threads spent runnable but
waiting for a CPU (``/proc/PID/schedstat``), the client's first-chunk times and longest silence
inside a stream, failed requests, the gateway's "now unhealthy" lines and restarts, tokens/s.

    .venv/bin/python bench/autogroup.py [--pairs 2] [--requests 6] [--tokens 1024] [--probes short] [--out FILE]
    .venv/bin/python bench/autogroup.py --rows FILE   # the table of a saved run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from math import nan
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.console.conftest import CLIENT_KEY, start_fleet, stop_fleet, tiny_instances  # noqa: E402
from tests.support.real_vllm import TINY_MODEL_DIR  # noqa: E402

MODES = ("own_session", "shipped")
# The baseline: the supervisor, its children each given a session of their own as before.
OWN_SESSION = """
import asyncio, runpy, sys
spawn = asyncio.create_subprocess_exec
async def own_session(*argv, process_group=None, **kw):
    return await spawn(*argv, start_new_session=True, **kw)
asyncio.create_subprocess_exec = own_session
sys.argv[0] = "fleet_supervisor"
runpy.run_module("fleet_supervisor", run_name="__main__")
"""
# Probe settings: the supervisor's (fleet file) and the gateway's (environment). "default" is the
# product's (fleetfile.py, gateway/settings.py); "short" the console test's, which a starved gateway
# failed: its probes of both replicas timed out together, the supervisor's of the gateway twice.
PROBES: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "default": ({"health_interval_s": 5.0, "health_timeout_s": 5.0, "health_failures": 3},
                {"FLEET_HEALTH_INTERVAL_S": "5", "FLEET_HEALTH_FAILURES": "3"}),
    "short": ({"health_interval_s": 1.0, "health_timeout_s": 1.0, "health_failures": 2},
              {"FLEET_HEALTH_INTERVAL_S": "0.2", "FLEET_HEALTH_FAILURES": "1"}),
}


def schedstat(pid: int) -> tuple[float, float]:
    """A thread's time on a CPU and runnable but waiting for one, seconds."""
    run, wait, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    return int(run) / 1e9, int(wait) / 1e9


def stream(url: str, model: str, tokens: int) -> dict[str, Any]:
    """One streamed chat completion: time to its first chunk, its longest silence, chunks, error."""
    import httpx

    body = {"model": model, "messages": [{"role": "user", "content": "Hello"}], "stream": True,
            "max_tokens": tokens, "temperature": 0.7, "ignore_eos": True}
    t0 = last = time.monotonic()
    first, silence, chunks, error = None, 0.0, 0, None
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120,
                          headers={"Authorization": f"Bearer {CLIENT_KEY}"}) as r:
            for line in r.iter_lines():
                now = time.monotonic()
                if line.startswith("data: {"):
                    first = now - t0 if first is None else first
                    silence, last, chunks = max(silence, now - last), now, chunks + 1
                    error = error or ('"error"' in line[:20] and line)
            error = error or (None if r.status_code == 200 else f"HTTP {r.status_code}")
    except httpx.HTTPError as e:
        error = repr(e)
    return {"first_s": first, "silence_s": silence, "chunks": chunks, "error": error}


def client_main(url: str, requests: int, tokens: int) -> None:
    t0 = time.monotonic()
    done = [stream(url, ("tiny-a", "tiny-b")[i % 2], tokens) for i in range(requests)]
    print(json.dumps({"wall_s": time.monotonic() - t0, "streams": done}))


def one_pass(mode: str, requests: int, tokens: int, probes: str = "default") -> dict[str, Any]:
    command = [sys.executable, "-c", OWN_SESSION] if mode == "own_session" else None
    with tempfile.TemporaryDirectory() as tmp:
        fleet = start_fleet(Path(tmp), tiny_instances(str(TINY_MODEL_DIR)), real_vllm=True, command=command,
                            startup_timeout_s=300, stop_grace_s=20, start_secs=5,
                            env=PROBES[probes][1], **PROBES[probes][0])
        try:
            fleet.wait_running(timeout=300)
            found = fleet.instances()
            gw, sup = found["gateway"]["pid"], fleet.proc.pid
            sessions = {n: os.getsid(i["pid"]) == os.getsid(sup) for n, i in found.items()}
            stream(fleet.gateway, "tiny-a", 16)  # first requests' one-off costs stay out of the pass
            stream(fleet.gateway, "tiny-b", 16)
            before, logged = {p: schedstat(p) for p in (gw, sup)}, fleet.output()
            client = subprocess.run([sys.executable, __file__, "--client", fleet.gateway, str(requests), str(tokens)],
                                    capture_output=True, text=True, timeout=900, start_new_session=True, check=True)
            same = fleet.instances()["gateway"]["pid"] == gw  # else restarted: its old thread's figures are gone
            after = {p: schedstat(p) if p != gw or same else (nan, nan) for p in (gw, sup)}
            log = fleet.output()[len(logged):]  # the client's run only, not the start
        finally:
            stop_fleet(fleet)
    done = json.loads(client.stdout)
    wall, streams = done["wall_s"], done["streams"]
    failed = sum(bool(s["error"]) for s in streams)
    return {"mode": mode, "probes": probes, "children_in_supervisor_session": sessions, "wall_s": wall,
            "tokens": tokens, "tokens_per_s": (requests - failed) * tokens / wall,  # streams that ended well
            "gateway_wait_share": (after[gw][1] - before[gw][1]) / wall,
            "supervisor_wait_share": (after[sup][1] - before[sup][1]) / wall,
            "first_chunk_s": [s["first_s"] for s in streams],
            "longest_silence_s": max(s["silence_s"] for s in streams),
            "failed": failed, "errors": [s["error"] for s in streams if s["error"]],
            "unhealthy_lines": log.count("is now unhealthy"),
            "gateway_restarts": log.count("gateway: RUNNING -> EXITED")}


def report(rows: list[dict[str, Any]]) -> str:
    lines = ["| mode | passes | gateway waiting for a CPU | supervisor waiting | first chunk, worst | longest silence "
             "| failed streams | unhealthy lines / gateway restarts | tokens/s |", "|---" * 9 + "|"]
    for mode in MODES:
        rs = [r for r in rows if r["mode"] == mode]
        if not rs:
            continue

        def span(key: str, scale: float = 1.0, fmt: str = "{:.2f}", rs: list[dict[str, Any]] = rs) -> str:
            vals = [r[key] * scale for r in rs]
            return f"{fmt.format(statistics.median(vals))} ({fmt.format(min(vals))}–{fmt.format(max(vals))})"
        worst = [max(x for x in r["first_chunk_s"] if x is not None) for r in rs]
        lines.append(f"| {mode} | {len(rs)} | {span('gateway_wait_share', 100, '{:.1f} %')} | "
                     f"{span('supervisor_wait_share', 100, '{:.1f} %')} | {statistics.median(worst):.2f} s "
                     f"({min(worst):.2f}–{max(worst):.2f}) | {span('longest_silence_s', 1, '{:.2f} s')} | "
                     f"{sum(r['failed'] for r in rs)} of {sum(len(r['first_chunk_s']) for r in rs)} | "
                     f"{sum(r['unhealthy_lines'] for r in rs)} / {sum(r['gateway_restarts'] for r in rs)} | "
                     f"{span('tokens_per_s', 1, '{:,.0f}')} |")
    return "\n".join(lines)


def summary(doc: dict[str, Any]) -> str:
    head = f"autogroup enabled: {doc['autogroup']}; CPUs: {doc['cpus']}; probes: {doc['probes']}"
    return head + "\n" + report(doc["rows"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=2, help="pairs of passes, alternated ABBA")
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--probes", choices=sorted(PROBES), default="default", help="health probe settings (see PROBES)")
    ap.add_argument("--out", help="write the rows here (JSON)")
    ap.add_argument("--rows", help="no run: the table of a saved run")
    ap.add_argument("--client", nargs=3, metavar=("URL", "REQUESTS", "TOKENS"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.client:
        client_main(a.client[0], int(a.client[1]), int(a.client[2]))
        return
    if a.rows:
        print(summary(json.loads(Path(a.rows).read_text())))
        return
    if not (TINY_MODEL_DIR / "config.json").exists():
        from vllm_fleet.tinymodel import make_tiny_model
        make_tiny_model(str(TINY_MODEL_DIR))
    rows = []
    for i in range(a.pairs):
        for mode in MODES if i % 2 == 0 else MODES[::-1]:  # ABBA: a drift weighs on both alike
            rows.append(one_pass(mode, a.requests, a.tokens, a.probes))
            print(json.dumps(rows[-1]), flush=True)
    flag = Path("/proc/sys/kernel/sched_autogroup_enabled")
    doc = {"autogroup": flag.read_text().strip() if flag.exists() else "absent",
           "cpus": len(os.sched_getaffinity(0)), "probes": a.probes, "rows": rows}
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=1))
    print(summary(doc))


if __name__ == "__main__":
    main()
