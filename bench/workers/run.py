"""How the gateway scales with ``--workers N``: requests/s and CPU per relayed event, N = 1, 2, 4, 8.

Placement (cores taken from this process's affinity, or --gateway-cpus/--upstream-cpus/--loadgen-cpus):
the gateway's whole process tree on the first N of the gateway cores (one core per worker); the
fake upstream (bench/compare/upstream.py, one process per upstream core, sharing one port with
SO_REUSEPORT) and the load generators (drive.py, one process per load core) on the other cores.
On a 16-core host: gateway 0-7, upstream 8-10, load 11-15. The ``direct`` row is load generator
to upstream with no gateway: the ceiling of the side cores; "side busy" near 1.0 in a row means
that row measured the side cores, not the gateway.

Phases, each after its connections are open, the load processes starting together:
  c64     64 concurrent non-streaming requests for --duration-s  -> requests/s, p50/p99
  c256    256 concurrent, the same                               -> requests/s, CPU per request
  paced   256 concurrent streams, 100 tokens 20 ms apart, 2 rounds -> CPU per event, TTFT, ITL

Backpressure limits are off here (FLEET_BACKEND_MAX_CONCURRENCY=0): this measures the proxy; what
the workers' shared limits add per request is measured by shared_cost.py.

    python bench/workers/run.py [--workers 1,2,4,8] [--duration-s 5] [--out bench/workers/results]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CLK = os.sysconf("SC_CLK_TCK")


def cpu_list(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += range(int(a), int(b or a) + 1)
    return out


def proc_cpu(pid: int) -> float:
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(f[11]) + int(f[12])) / CLK


def group_cpu(pgid: int) -> float:
    total = 0.0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                f = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(f[2]) == pgid:
                total += (int(f[11]) + int(f[12])) / CLK
    return total


def workers_of(parent: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == parent and b"spawn_main" in Path(f"/proc/{d}/cmdline").read_bytes():
                out.append(int(d))
        except (OSError, ValueError, IndexError):
            continue
    return out


def spawn(argv: list[str], cpus: list[int], log: Path | None, env: dict[str, str] | None = None,
          capture: bool = False) -> subprocess.Popen[bytes]:
    def pin() -> None:
        os.sched_setaffinity(0, set(cpus))  # before exec: the whole tree inherits it

    out: Any = subprocess.PIPE if capture else open(log or os.devnull, "ab")  # noqa: SIM115
    return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT if not capture else None, cwd=ROOT,
                            env={**os.environ, **(env or {})}, start_new_session=True, preexec_fn=pin)


def stop(p: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the leader (the gateway's parent stops its workers), then SIGKILL to the group."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(p.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(15)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)  # anything left in the group
    p.wait()


def wait_ready(url: str, p: subprocess.Popen[bytes], times: int, timeout: float = 60) -> None:
    """/ready answered 200 ``times`` in a row on new connections (so by every worker, likely)."""
    deadline, ok = time.monotonic() + timeout, 0
    while ok < times:
        if p.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{url} not ready (exit {p.poll()})")
        try:
            ok = ok + 1 if httpx.get(url + "/ready", timeout=2).status_code == 200 else 0
        except httpx.HTTPError:
            ok = 0
        time.sleep(0.05 if ok else 0.2)


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3, 3)


def phase(a: argparse.Namespace, url: str, kind: str, conc: int, gw: subprocess.Popen[bytes] | None,
          ups: list[subprocess.Popen[bytes]]) -> dict[str, Any]:
    k = len(a.loadgen)
    start_at = time.time() + a.warmup_s
    dur = a.duration_s if kind == "requests" else a.paced_tokens * a.token_ms / 1000 * (1 + a.rounds) + 5
    drivers = []
    for i, cpu in enumerate(a.loadgen):
        c = conc // k + (1 if i < conc % k else 0)
        argv = [sys.executable, str(HERE / "drive.py"), "--url", url, "--kind", kind, "--conc", str(c),
                "--start-at", str(start_at), "--duration-s", str(dur), "--tokens", str(a.paced_tokens),
                "--rounds", str(a.rounds), "--stagger-s", str(a.paced_tokens * a.token_ms / 1000)]
        drivers.append(spawn(argv, [cpu], None, capture=True))
    time.sleep(max(0.0, start_at - time.time()))
    wpids = workers_of(gw.pid) if gw else []
    t0 = time.perf_counter()
    g0 = group_cpu(gw.pid) if gw else 0.0
    w0 = {p: proc_cpu(p) for p in wpids}
    u0 = sum(proc_cpu(u.pid) for u in ups)
    outs = [json.loads(d.communicate(timeout=dur + 60)[0] or b"{}") for d in drivers]
    wall = time.perf_counter() - t0
    g1 = group_cpu(gw.pid) if gw else 0.0
    wcpu = sorted(proc_cpu(p) - w0[p] for p in wpids)
    up_cpu = sum(proc_cpu(u.pid) for u in ups) - u0
    merged: dict[str, Any] = {key: [x for o in outs for x in o.get(key, [])] for key in ("latencies", "ttft", "itl")}
    done, events = sum(o.get("done", 0) for o in outs), sum(o.get("events", 0) for o in outs)
    errors = sum(o.get("errors", 0) for o in outs)
    side = (up_cpu + sum(o.get("cpu_s", 0.0) for o in outs)) / (wall * len(set(a.upstream + a.loadgen)))
    row: dict[str, Any] = {"done": done, "errors": errors, "wall_s": round(wall, 2), "side_busy": round(side, 2)}
    if errors:
        row["first_error"] = next(o["first_error"] for o in outs if o.get("first_error"))
    if kind == "requests":
        row.update(rps=round(done / a.duration_s, 1), p50_ms=pct(merged["latencies"], 0.5),
                   p99_ms=pct(merged["latencies"], 0.99))
    else:
        row.update(events=events, ttft_p50_ms=pct(merged["ttft"], 0.5), ttft_p99_ms=pct(merged["ttft"], 0.99),
                   itl_p50_ms=pct(merged["itl"], 0.5), itl_p99_ms=pct(merged["itl"], 0.99))
    if gw:
        cpu = g1 - g0
        row["gateway_cores_busy"] = round(cpu / wall, 2)
        row["cpu_us_per_request"] = round(cpu / done * 1e6, 1) if done else None
        if events:
            row["cpu_us_per_event"] = round(cpu / events * 1e6, 2)
        if len(wcpu) > 1 and wcpu[0] > 0:
            row["worker_cpu_max_over_min"] = round(wcpu[-1] / wcpu[0], 2)
    return row


def measure(a: argparse.Namespace, url: str, gw: subprocess.Popen[bytes] | None,
            ups: list[subprocess.Popen[bytes]]) -> dict[str, Any]:
    return {"c64": phase(a, url, "requests", 64, gw, ups), "c256": phase(a, url, "requests", 256, gw, ups),
            "paced": phase(a, url, "streams", a.paced_streams, gw, ups)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mine = sorted(os.sched_getaffinity(0))
    big = len(mine) >= 16
    ap.add_argument("--workers", default="1,2,4,8" if big else "1,2")
    ap.add_argument("--gateway-cpus", default=",".join(map(str, mine[:8] if big else mine[:1])))
    ap.add_argument("--upstream-cpus", default=",".join(map(str, mine[8:11] if big else mine[-1:])))
    ap.add_argument("--loadgen-cpus", default=",".join(map(str, mine[11:16] if big else mine[-1:])))
    ap.add_argument("--duration-s", type=float, default=5.0)
    ap.add_argument("--warmup-s", type=float, default=3.0, help="time the load processes get to connect")
    ap.add_argument("--paced-streams", type=int, default=256)
    ap.add_argument("--paced-tokens", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--token-ms", type=float, default=20.0)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    a = ap.parse_args()
    a.gateway, a.upstream, a.loadgen = (cpu_list(x) for x in (a.gateway_cpus, a.upstream_cpus, a.loadgen_cpus))
    counts = [int(n) for n in a.workers.split(",")]
    work = a.out / "work"
    work.mkdir(parents=True, exist_ok=True)
    port, gw_port = 19300 + os.getpid() % 500, 19900 + os.getpid() % 500
    up_url, gw_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{gw_port}"
    ups = [spawn([sys.executable, str(ROOT / "bench/compare/upstream.py"), "--port", str(port), "--token-ms",
                  str(a.token_ms), "--reuse-port"], [c], work / f"upstream-{c}.log") for c in a.upstream]
    res: dict[str, Any] = {"host": {"cpus": len(mine), "python": platform.python_version(),
                                    "kernel": platform.release(), "gateway_cpus": a.gateway,
                                    "upstream_cpus": a.upstream, "loadgen_cpus": a.loadgen},
                           "params": {k: v for k, v in vars(a).items() if isinstance(v, (int, float, str))},
                           "rows": {}}
    t_start = time.monotonic()
    try:
        time.sleep(1.0)
        print("direct ...", flush=True)
        res["rows"]["direct"] = measure(a, up_url, None, ups)
        cfg = work / "gateway.json"
        cfg.write_text(json.dumps({"backend": "vllm", "served_models": ["m", "paced"],
                                   "vllm_instances": [{"host": up_url, "models": ["m", "paced"], "name": "up"}]}))
        env = {"FLEET_HOST": "127.0.0.1", "FLEET_PORT": str(gw_port), "FLEET_LOG_LEVEL": "warning",
               "FLEET_ACCESS_LOG": "false", "FLEET_HEALTH_INTERVAL_S": "5", "FLEET_BACKEND_MAX_CONCURRENCY": "0",
               "FLEET_MAX_IN_FLIGHT": "100000",
               "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        for n in counts:
            print(f"gateway --workers {n} ...", flush=True)
            gw = spawn([sys.executable, "-m", "gateway", "-c", str(cfg), "--workers", str(n)], a.gateway[:n],
                       work / f"gateway-{n}.log", env)
            try:
                wait_ready(gw_url, gw, 4 * n)
                res["rows"][f"workers={n}"] = {"workers": n, **measure(a, gw_url, gw, ups)}
            finally:
                stop(gw)
    finally:
        for u in ups:
            stop(u)
    res["wall_s"] = round(time.monotonic() - t_start, 1)
    md = markdown(res)
    (a.out / "workers.json").write_text(json.dumps(res, indent=2))
    (a.out / "workers.md").write_text(md)
    print(md)


def markdown(res: dict[str, Any]) -> str:
    rows = res["rows"]
    base = rows.get("workers=1", {})

    def ratio(r: dict[str, Any], ph: str, key: str) -> str:
        b, v = base.get(ph, {}).get(key), r.get(ph, {}).get(key)
        return f"{v / b:.2f}×" if b and v is not None else "–"

    h = res["host"]
    out = [f"Host: {h['cpus']} CPUs, Python {h['python']}, kernel {h['kernel']}; gateway on CPUs "
           f"{h['gateway_cpus']} (first N), upstream on {h['upstream_cpus']}, load on {h['loadgen_cpus']}. "
           f"Ratios are to workers=1 in this run ({res['wall_s']} s).", "",
           "| target | req/s @64 | ×w1 | p99 ms @64 | req/s @256 | ×w1 | CPU µs/req @256 "
           "| CPU µs/event paced 256 | ×w1 | TTFT p99 ms paced | gateway cores busy @256 "
           "| worker CPU max/min @256 | side busy @256 | errors |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        c64, c256, pc = r["c64"], r["c256"], r["paced"]
        errs = c64["errors"] + c256["errors"] + pc["errors"]
        out.append(f"| {name} | {c64['rps']} | {ratio(r, 'c64', 'rps')} | {c64['p99_ms']} | {c256['rps']} | "
                   f"{ratio(r, 'c256', 'rps')} | {c256.get('cpu_us_per_request', '–')} | "
                   f"{pc.get('cpu_us_per_event', '–')} | {ratio(r, 'paced', 'cpu_us_per_event')} | "
                   f"{pc['ttft_p99_ms']} | {c256.get('gateway_cores_busy', '–')} | "
                   f"{c256.get('worker_cpu_max_over_min', '–')} | {c256['side_busy']} | {errs} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
