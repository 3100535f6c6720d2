"""Issue 21's GPU benchmark: ``vllm bench serve`` straight to one vLLM and through the gateway,
interleaved, several passes per concurrency, with the gateway's own queue wait beside it.

    python3 bench/gpu/serve_pairs.py start --model-dir DIR --out W [--workers N]  # vllm-fleet up, left running
    python3 bench/gpu/serve_pairs.py run --out W --conc 256 --passes 3     # direct/gateway pairs, appended
    python3 bench/gpu/serve_pairs.py stop --out W                          # stop, then the table

One instance of the tiny model on GPU 0 (served as ``tiny``) under ``vllm-fleet up`` with the
gateway's default settings: its ``backend_max_concurrency`` is the instance's vLLM
``max_num_seqs`` (1,024 on a GPU of 70 GiB and more). Passes alternate their order (direct first,
then gateway first, ...) so drift over the run shows up as spread, not as a difference. Each
gateway pass also reads, from the gateway's /metrics before and after, how many requests queued
in the gateway and their mean wait (``fleet_queue_wait_seconds``), and the mean time to first
byte the gateway measured (``fleet_time_to_first_byte_seconds``). ``up`` is started in its own
session so that it outlives one device call; ``stop`` stops it by PID (OUT/up.pid).

``run --clients K`` splits each pass over K client processes (bench_clients.py), each with a fixed
share of the prompts. With K > 1 the direct path does not hold the concurrency asked for: vLLM
serves one process's connections first, that process runs out of prompts early, and the rest of the
pass runs with fewer streams (on an H200 at 512: 222–312 requests in flight on average, the
gateway 376–415; results/serve-pairs-h200-k1). Each row's ``mean_in_flight`` and ``client_end_s``
show it; the default K = 1 held 926–990 of 1,024 on both paths. ``--range-ratio R``
draws lengths in 128 × [1 - R, 1 + R] and ``--rate Q`` sends Poisson arrivals at Q requests/s
instead of the closed loop (rows and tags say which, pair_stats.py groups by it). ``run --probe``
adds where the time goes (tail_probe.py); against a traced gateway (gateway_variant.py --trace)
and after ``start --trace-vllm`` it also places each request's time (trace_join.py), and
pair_stats.py turns the rows into ratios with their intervals. ``run --pin`` runs each pair again
right after it with the gateway, the client and vLLM on physical cores of their own (pin.py; tags
"-pin"), and the target ``burn`` is a direct pass with burn.py keeping the gateway's share of a CPU
busy: two ways to tell whether the gateway slows vLLM by sharing the host's CPUs. ``start
--client-core`` keeps the last physical core out of ``up``'s reach (``up`` places the gateway and
vLLM on the rest by its default) and ``run`` puts the client there (tags "-cc"), as if it ran on
another host.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_clients import shape_args
from detached_up import launch_up, placed, stop
from gpu_fleet import GW, base_fleet, bench, fleet_healthy, group, inst, instances, log, pgid, wait
from pin import cores, off_host, pin, plan
from tail_probe import SocketSampler, moved, snapshot, ttft_shape
from trace_join import arrivals, join

DIRECT = "http://127.0.0.1:8001"
TCP_RELAY = "http://127.0.0.1:8090"  # tcp_relay.py, the control for the TTFT tail (--targets)
MODEL = "tiny"
VLLM_TRACE = "vllm-trace.txt"
CLIENT_CPUS = "client-cpus.json"  # start --client-core: the CPUs run keeps the client on
KEYS = ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "mean_in_flight")
Shape = tuple[float, float | None]  # the load's --range-ratio and --rate (bench_clients.shape_args)


def shape_tag(shape: Shape) -> str:
    """A pass tag's part for a load other than the closed loop of fixed lengths: "-r0.5", "-q70"."""
    return (f"-r{shape[0]:g}" if shape[0] else "") + (f"-q{shape[1]:g}" if shape[1] else "")


def start(model_dir: str, w: Path, workers: int, trace_vllm: bool = False,
          client_core: bool = False) -> dict[str, Any]:
    fleet = {**base_fleet(w), "instances": [{**inst("a", model_dir, [0], [MODEL], 8001),
                                             "gpu_memory_utilization": 0.5}]}
    if trace_vllm:  # vllm_trace/sitecustomize.py in the instance: when it read each request
        here = str(Path(__file__).resolve().parent / "vllm_trace")
        fleet["instances"][0]["env"] = {"PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]),
                                        "FLEET_TRACE_FILE": str(w / VLLM_TRACE)}
    fleet["gateway"]["workers"] = workers
    client, rest = off_host(cores()) if client_core else (None, None)
    (w / CLIENT_CPUS).write_text(json.dumps(sorted(client) if client else None))
    launch_up(w, fleet, rest)
    took = wait(lambda: fleet_healthy(["a"]) and len(instances()) == 2, 420, "instance a in rotation")
    return {"up_to_ready_s": round(took, 1), "fleet": httpx.get(GW + "/fleet", timeout=5).json(),
            "cpus": placed(w), "client_cpus": sorted(client) if client else None}


def _samples(text: str) -> dict[str, float]:
    want = {"q_sum": rf'fleet_queue_wait_seconds_sum{{model="{MODEL}"}}',
            "q_count": rf'fleet_queue_wait_seconds_count{{model="{MODEL}"}}',
            "ttfb_sum": rf'fleet_time_to_first_byte_seconds_sum{{model="{MODEL}"}}',
            "ttfb_count": rf'fleet_time_to_first_byte_seconds_count{{model="{MODEL}"}}'}
    out = {}
    for k, name in want.items():
        m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        out[k] = float(m.group(1)) if m else 0.0
    return out


def _trace(base: str) -> list[dict[str, Any]] | None:
    """A traced gateway's records (and it forgets them); None from any other server."""
    r = httpx.get(base + "/_trace", timeout=10)
    body = r.json() if r.status_code == 200 and r.headers.get("content-type") == "application/json" else None
    return body if isinstance(body, list) else None


def _gateway_pid() -> int | None:
    return next((i["pid"] for n, i in instances().items() if n == "gateway"), None)


def one(model_dir: str, w: Path, target: str, conc: int, tag: str, probe: bool = False,
        clients: int = 1, shape: Shape = (0.0, None)) -> dict[str, Any]:
    base = ({"direct": DIRECT, "burn": DIRECT, "gateway": GW, "tcp": TCP_RELAY}.get(target)
            or f"http://127.0.0.1:{target.split(':')[1]}")
    burner = (subprocess.Popen([sys.executable, str(Path(__file__).resolve().parent / "burn.py")])
              if target == "burn" else None)  # direct, with the gateway's share of a CPU busy beside it
    before = _samples(httpx.get(GW + "/metrics", timeout=10).text)
    snap = snapshot(DIRECT, GW) if probe else None
    traced = probe and _trace(base) is not None  # a gateway_trace.py gateway: its records so far dropped
    sockets = SocketSampler((8001, 8080)) if probe else None
    try:
        with sockets or contextlib.nullcontext():
            r = bench(model_dir, base, MODEL, w, tag, prompts=3 * conc, conc=conc,
                      gw_pid=_gateway_pid() if target == "gateway" else None, detailed=probe, clients=clients,
                      shape=shape_args(*shape, clients))
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
    if snap is not None and sockets is not None:
        r["probe"] = moved(snap, snapshot(DIRECT, GW))
        r["probe"]["sockets"] = sockets.summary()
        ids, starts, ttfts = r.pop("ids"), r.pop("start_times"), r.pop("ttfts")
        r["probe"]["client_ttft"] = ttft_shape(ttfts)
        vllm_lines = (w / VLLM_TRACE).read_text().splitlines() if (w / VLLM_TRACE).exists() else []
        if traced:
            records = _trace(base) or []
            (w / f"trace-{tag}.json").write_text(json.dumps(records))  # raw, for questions asked later
            r["probe"]["phases"] = join(ids, starts, ttfts, records, vllm_lines)
        elif target == "direct" and vllm_lines:
            r["probe"]["phases"] = arrivals(ids, starts, ttfts, vllm_lines)
        log(f"{tag} probe: {json.dumps(r['probe'])}")
    after = _samples(httpx.get(GW + "/metrics", timeout=10).text)
    r.update(target=target, conc=conc, tag=tag, range_ratio=shape[0], request_rate=shape[1])
    if target == "gateway":
        d = {k: after[k] - before[k] for k in after}
        r["queued"] = int(d["q_count"])
        r["mean_queue_wait_ms"] = round(d["q_sum"] / max(1, r.get("completed") or 1) * 1000, 2)
        r["gateway_ttfb_mean_ms"] = round(d["ttfb_sum"] / max(1.0, d["ttfb_count"]) * 1000, 1)
    log(f"{tag}: " + ", ".join(f"{k}={r.get(k)}" for k in (*KEYS, "queued", "mean_queue_wait_ms", "client_cpu_share")))
    return r


def _pinned(on: bool) -> dict[str, Any]:
    """pin.py's placement (on) or every CPU for everyone (off: what ``gateway.cpus: all`` gives, so
    the unpinned passes stay the baseline without placement); what was placed where."""
    groups = cores()
    every = {c for g in groups for c in g}
    where = plan(groups) if on else {name: every for name in ("gateway", "client", "vllm")}
    procs = instances()
    threads = {name: pin(group(pg), where[name]) for name, key in (("gateway", "gateway"), ("vllm", "a"))
             if key in procs and (pg := pgid(procs[key]["pid"])) is not None}
    os.sched_setaffinity(0, where["client"])  # this process, so the client processes it starts
    return {"cpus": {k: sorted(v) for k, v in where.items()}, "threads_moved": threads}


def run(model_dir: str, w: Path, concs: list[int], passes: int, probe: bool = False,
        targets: tuple[str, ...] = ("direct", "gateway"), clients: int = 1,
        shape: Shape = (0.0, None), pin_too: bool = False) -> list[dict[str, Any]]:
    """Interleaved passes; with ``pin_too`` each pair again right after it with the CPUs pinned
    (pin.py; tags "-pin"), so pinned and unpinned pairs alternate on one machine."""
    rows_path = w / "rows.json"
    rows: list[dict[str, Any]] = json.loads(rows_path.read_text()) if rows_path.exists() else []
    client = json.loads((w / CLIENT_CPUS).read_text()) if (w / CLIENT_CPUS).exists() else None
    if client and pin_too:
        raise SystemExit("--pin places every process itself: start again without --client-core")
    if client:  # this process, so the client processes it starts
        os.sched_setaffinity(0, set(client))
    cc = {"client_cpus": client} if client else {}
    try:
        for conc in concs:
            for p in range(passes):
                order = list(targets) if p % 2 == 0 else list(reversed(targets))
                for pinned in (False, True) if pin_too else (False,):
                    placed = _pinned(pinned) if pin_too else None
                    for target in order:
                        where = ("-pin" if pinned else "") + ("-cc" if client else "")
                        tag = f"c{conc}-k{clients}{shape_tag(shape)}{where}-p{p}-{target}"
                        rows.append({**one(model_dir, w, target, conc, tag, probe, clients, shape),
                                     **({"pin": placed} if pinned else {}), **cc})
                        rows_path.write_text(json.dumps(rows, indent=1))
    finally:
        if pin_too:  # not after a SIGKILL or timeout's SIGTERM: then `run --pin --passes 0` unpins
            _pinned(False)
    return rows


def _shape(row: dict[str, Any]) -> str:
    return (shape_tag((row.get("range_ratio") or 0.0, row.get("request_rate"))) + ("-pin" if row.get("pin") else "")
            + ("-cc" if row.get("client_cpus") else ""))


def table(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per concurrency (and client processes, where more than one): the median of each metric per
    target, its spread (min..max), each target's ratio to direct."""
    res: dict[str, Any] = {}
    targets = sorted({r["target"] for r in rows})
    for conc, k, shape in sorted({(r["conc"], r.get("clients", 1), _shape(r)) for r in rows}):
        entry: dict[str, Any] = {}
        for key in (*KEYS, "mean_queue_wait_ms", "gateway_cpu_us_per_event"):
            per: dict[str, list[float]] = {}
            for t in targets:
                vals = [float(r[key]) for r in rows if r["conc"] == conc and r.get("clients", 1) == k
                        and _shape(r) == shape and r["target"] == t and r.get(key) is not None]
                if vals:
                    per[t] = vals
            if not per:
                continue
            entry[key] = {t: {"median": round(statistics.median(v), 2), "min": round(min(v), 2),
                              "max": round(max(v), 2), "n": len(v)} for t, v in per.items()}
            base = statistics.median(per["direct"]) if "direct" in per else 0
            for t in per:
                if t != "direct" and base:
                    entry[key][f"ratio_{t}" if t != "gateway" else "ratio"] = round(statistics.median(per[t]) / base, 3)
        res[(str(conc) if k == 1 else f"{conc}/k{k}") + shape] = entry
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("phase", choices=["start", "run", "stop"])
    ap.add_argument("--model-dir", default="/tmp/tiny-model")
    ap.add_argument("--out", required=True)
    ap.add_argument("--conc", type=int, nargs="+", default=[256])
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--workers", type=int, default=1, help="gateway workers (start); CPU per event then "
                    "counts the master process only")
    ap.add_argument("--probe", action="store_true", help="run: also where the slow first tokens are spent "
                    "(tail_probe.py: vLLM's and the gateway's histograms, TCP counters, each request's TTFT)")
    ap.add_argument("--trace-vllm", action="store_true", help="start: the instance notes when it read each "
                    "request (vllm_trace/), joined with direct passes under --probe")
    ap.add_argument("--clients", type=int, default=1, help="run: vllm bench serve processes per pass, each with "
                    "conc/K streams (bench_clients.py)")
    ap.add_argument("--range-ratio", type=float, default=0.0, help="run: input and output lengths drawn in "
                    "128 × [1 - R, 1 + R] (vllm bench serve --random-range-ratio); 0: all 128")
    ap.add_argument("--rate", type=float, default=None, help="run: an open loop, Poisson arrivals at this many "
                    "requests/s in all, at most --conc in flight; default: a closed loop of --conc")
    ap.add_argument("--pin", action="store_true", help="run: each pair again with the gateway, the client and vLLM "
                    "on CPUs of their own (pin.py)")
    ap.add_argument("--client-core", action="store_true", help="start: the last physical core kept from `up` "
                    "for the client, which run puts there, as if on another host (pin.off_host)")
    ap.add_argument("--targets", default="direct,gateway", help="run: which, in order (tcp: tcp_relay.py on 8090; "
                    "burn: direct with burn.py beside it; "
                    "NAME:PORT any other server)")
    a = ap.parse_args()
    w = Path(a.out)
    w.mkdir(parents=True, exist_ok=True)
    if a.phase == "start":
        res: Any = start(a.model_dir, w, a.workers, a.trace_vllm, a.client_core)
    elif a.phase == "run":
        res = table(run(a.model_dir, w, a.conc, a.passes, a.probe, tuple(a.targets.split(",")), a.clients,
                        (a.range_ratio, a.rate), a.pin))
    else:
        rows = json.loads((w / "rows.json").read_text()) if (w / "rows.json").exists() else []
        res = {"stop": stop(w), "table": table(rows)}
    (w / f"{a.phase}.json").write_text(json.dumps(res, indent=1, default=str))
    print(json.dumps(res, indent=1, default=str)[-8000:])


if __name__ == "__main__":
    main()
