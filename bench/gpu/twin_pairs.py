"""Issue 21's GPU benchmark with the direct and the gateway pass at the same time, on twin GPUs.

    python3 bench/gpu/twin_pairs.py start --out W                 # two instances under `up`, left running
    python3 bench/gpu/twin_pairs.py run --out W --conc 1024 --passes 6
    python3 bench/gpu/twin_pairs.py stop --out W                  # stop `up`, then twin_stats.py's tables

Why: on one GPU, direct vLLM alone moves 7–16 % in tokens/s from one pass to the next
(results/serve-cc-h200), so a ±1 % answer by sequential pairs takes hundreds of them. Here two
instances of the tiny model run under ``vllm-fleet up``, ``a`` on GPU 0 (port 8001, served
``tiny-a``) and ``b`` on GPU 1 (8002, ``tiny-b``), with the gateway's defaults. Each pass runs two
closed loops of ``--conc`` streams at once, each on a client core of its own that ``up`` does not
use (window_client.py, one process each), measured over the same seconds:

- ``gb``: direct to a, and through the gateway to b;
- ``ga``: through the gateway to a, and direct to b (GPUs and client cores swapped);
- ``aa``: direct to both, no gateway: how far two simultaneous sides differ with no gateway at all;
- ``jb`` / ``ja``: direct to both, the side on b (a) pausing a random 0–``--jitter-ms`` before each
  next request (window_client.py): whether successors that reach vLLM spread out, as a proxy's
  serial relay spreads them, move vLLM the way the gateway's side moves it;
- ``gbp`` / ``gap`` (any kind with a trailing ``p``): that pass with each instance's engine core
  loop alone on a CPU of its own, every other thread of both instances on the rest of `up`'s
  CPUs (pin.engines_apart); any other pass puts them back where `up` had them. At 256 streams
  the 2.8 B model's gateway side stepped slower with both engine cores CPU-bound
  (results/twin-2b8-h200x2): whether where the scheduler ran them was the cause;
- ``gbi`` / ``gai`` (a trailing ``i``, with or beside the ``p``): each direct side's client also
  holds ``--direct-idle`` connections to its instance, used once and left idle
  (window_client.py's ``--idle``). Meant to match the gateway's warm pool on the other side; but
  the pool reaches both instances, so this raises the direct side's vLLM from 1,536 connections
  to 2,048 against the gateway side's 1,024 (results/twin-idle-h200x2);
- ``gbh`` / ``gah`` (a trailing ``h``): the same idle connections held by a process of their own
  (window_client.py ``--conc 0``) on the client's core: whether vLLM's slow mode at 2,048 was the
  connections at vLLM or the client's loop holding them beside its streams.

Whatever the host does during a pass (its other tenants, clocks, the other instance), both sides
see. A difference between the two GPUs cancels between a ``gb`` and the ``ga`` next to it
(twin_stats.py's swap pairs). The answer (results/twin-h200x2): running at once removes part
of the tokens/s spread and none of TTFT's; two direct sides in the same seconds still differ by
4–15 % and 11–22 % over 24 s. Over 120 s (results/twin-long-h200x2) that spread turned out to
be the load's waves of one request's life: TTFT p50's falls as 1/√T past about 12 s, tokens/s'
keeps a part of its own in each pass. The waves are vLLM's (results/twin-waves-h200x2: staggered
starts do not stop them; in_pass.py's samples show the engine emptying and filling), and which
way an instance settles holds for a whole pass and moves TTFT p50 by up to 1.7×. What this
design does not show: an effect of the gateway's CPU use on vLLM that hits both instances alike
(``up`` gives the gateway a core of its own, results/serve-pin-h200-512 measured that
contention), and the gateway's queue at concurrency above an instance's ``max_num_seqs``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from api_split import Recorder
from bench_clients import cpu_seconds
from detached_up import launch_up, placed, stop
from gpu_fleet import GW, base_fleet, fleet_healthy, inst, instances, wait
from in_pass import Sampler, descendants, engine, gauge, instance, means, vllm_means
from pin import busiest, cores, engines_apart, pin
from prof import collect, record
from twin_stats import report

HERE = Path(__file__).resolve().parent
PORTS = {"a": 8001, "b": 8002}
CLIENT_CPUS = "client-cpus.json"
INSTANCE_CPUS = "instance-cpus.json"  # where `up` placed the instances, kept before any pass moves them
KINDS = ("gb", "ga", "aa", "jb", "ja")  # the order the passes cycle through; a trailing p: engines apart
_QUEUED = re.compile(r"^fleet_queue_wait_seconds_count\{[^}]*\} (\S+)$", re.M)
_BUSY = re.compile(r"^vllm:num_requests_(?:running|waiting)\{[^}]*\} (\S+)$", re.M)


def split_kind(kind: str) -> tuple[str, bool, str]:
    """``--kinds``' entry as (the kind of pass, whether the engines run apart, who holds each direct
    side's idle connections: "" none, "client" or "holder"): ``gbp`` -> (gb, True, ""),
    ``gai`` -> (ga, False, "client"), ``gbh`` -> (gb, False, "holder")."""
    flags = kind[2:]
    if len(kind) < 2 or len(set(flags)) != len(flags) or set(flags) - {"p", "i", "h"} or {"i", "h"} <= set(flags):
        return kind, False, ""  # not a kind: run's check names it
    return kind[:2], "p" in flags, "client" if "i" in flags else "holder" if "h" in flags else ""


def sides(kind: str) -> list[tuple[str, str, str]]:
    """(path, base URL, served name) for each side of a pass, the first on client core 0."""
    direct = {i: (f"direct:{i}", f"http://127.0.0.1:{p}", f"tiny-{i}") for i, p in PORTS.items()}
    if kind == "aa":
        return [direct["a"], direct["b"]]
    to = kind[1]
    other = direct["b" if to == "a" else "a"]
    if kind[0] == "j":
        return [other, (f"jitter:{to}", *direct[to][1:])]
    return [other, (f"gateway:{to}", GW, f"tiny-{to}")]


def start(model_dir: str, w: Path, vllm_args: list[str] | None = None,
          vllm_command: list[str] | None = None) -> dict[str, Any]:
    """``vllm_args``: each instance's vLLM arguments instead of gpu_fleet's (``--enforce-eager``...);
    ``vllm_command``: the fleet file's ``vllm_command`` instead of its default (the `vllm serve`
    CLI, which alone runs ``--api-server-count`` above 1)."""
    fleet = {**base_fleet(w), "instances": [{**inst(i, model_dir, [n], [f"tiny-{i}"], p), "gpu_memory_utilization": 0.5}
                                            for n, (i, p) in enumerate(PORTS.items())]}
    if vllm_command is not None:
        fleet["vllm_command"] = vllm_command
    if vllm_args is not None:
        for i in fleet["instances"]:
            i["vllm_args"] = list(vllm_args)  # a list each: no YAML anchor in the fleet file
    groups = cores()
    if len(groups) < 4:
        raise SystemExit(f"twin passes need 4 physical cores (2 clients, the gateway, vLLM), not {len(groups)}")
    client = [groups[-2][0], groups[-1][0]]  # one CPU of each of the last two cores, out of `up`'s reach
    (w / CLIENT_CPUS).write_text(json.dumps(client))
    launch_up(w, fleet, {c for g in groups[:-2] for c in g})
    took = wait(lambda: fleet_healthy(["a", "b"]) and len(instances()) == 3, 420, "instances a and b in rotation")
    return {"up_to_ready_s": round(took, 1), "fleet": httpx.get(GW + "/fleet", timeout=5).json(),
            "vllm_args": fleet["instances"][0]["vllm_args"], "vllm_command": fleet.get("vllm_command"),
            "gateway_env": {k: v for k, v in os.environ.items() if k.startswith("FLEET_")},
            "cpus": placed(w), "client_cpus": client}


def _sum(pattern: re.Pattern[str], url: str) -> float:
    return gauge(pattern, httpx.get(url, timeout=10).text)


def drain(timeout: float = 60.0, ports: Iterable[int] | None = None) -> float:
    """Seconds until no instance (on ``ports``, else PORTS' as they are at the call) runs or holds
    a request (the last pass's streams aborted), at most ``timeout``."""
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        if all(_sum(_BUSY, f"http://127.0.0.1:{p}/metrics") == 0 for p in (ports or PORTS.values())):
            break
        time.sleep(0.5)
    return round(time.monotonic() - t, 1)


def place(w: Path, pids: dict[str, int], apart: bool) -> dict[str, Any] | None:
    """Before a pass: with ``apart``, each instance's engine core loop on a CPU of its own
    (pin.engines_apart) among the CPUs `up` gave the instances; without, every thread of the
    instances back on all of those, as `up` placed them (so a pass after a pinned one is not)."""
    if not pids:
        return None
    procs = {name: [pid, *descendants(pid)] for name, pid in pids.items()}
    path = w / INSTANCE_CPUS
    if not path.exists():
        path.write_text(json.dumps(sorted(os.sched_getaffinity(min(pids.values())))))
    cpus = json.loads(path.read_text())
    if apart:
        return engines_apart(procs, cpus)
    pin([p for ps in procs.values() for p in ps], set(cpus))
    return None


def profile(w: Path, pids: dict[str, int], name: str, delay: float, seconds: float) -> dict[str, Any]:
    """py-spy on each instance's API server and engine core (its busiest process below the API
    server) over the window, on the instances' CPUs (prof.py); {} without py-spy."""
    cpus = set(json.loads((w / INSTANCE_CPUS).read_text()))
    spies: dict[str, Any] = {}
    for inst_name, pid in pids.items():
        eng = busiest(descendants(pid))
        for proc, target in (("api", pid), ("engine", eng[0] if eng else None)):
            out = w / "sides" / f"{name}-{inst_name}-{proc}.txt"
            if target and (spy := record(target, out, delay, seconds, cpus)) is not None:
                spies.setdefault(inst_name, {})[proc] = (spy, out)
    return spies


def one(model_dir: str, w: Path, kind: str, conc: int, n: int, clients: list[int],
        timing: dict[str, float], jitter_ms: float = 0.0, apart: bool = False,
        prof: bool = False, direct_idle: int = 0, idle_by: str = "client") -> dict[str, Any]:
    """One pass; ``direct_idle`` connections held idle at each direct side's instance, by its
    client's loop (``idle_by`` "client") or by a process of their own ("holder")."""
    listed = instances()
    pids = {name: i["pid"] for name, i in listed.items() if name in PORTS and i.get("pid")}
    gw_pid = listed.get("gateway", {}).get("pid")
    pinned = place(w, pids, apart)
    drained = drain()
    queued0, cpu0 = _sum(_QUEUED, GW + "/metrics"), cpu_seconds(gw_pid) if gw_pid else None
    t0 = time.monotonic() + 3.0  # both clients import and connect before it
    sampler = Sampler({i: f"http://127.0.0.1:{p}" for i, p in PORTS.items()}, GW, t0, pids=pids,
                      gpus={i: k for k, i in enumerate(PORTS)})  # as start() placed them
    sampler.start()
    split = Recorder(PORTS, pids, t0 + timing["warmup"], t0 + timing["warmup"] + timing["window"])
    split.start()
    procs, holders = [], []
    (w / "sides").mkdir(exist_ok=True)  # apart: a device call returns few files
    for k, (path, base, served) in enumerate(sides(kind)):
        cpu = clients[(k + n) % 2]  # the client cores swap every pass too
        out = w / "sides" / f"c{conc}-p{n}-{k}.json"
        idle = direct_idle if path.startswith("direct") else 0
        cmd = [sys.executable, str(HERE / "window_client.py"), "--base", base, "--model", served,
               "--tokenizer", model_dir, "--conc", str(conc), "--t0", str(t0), "--seed", str(1000 * n + k),
               "--out", str(out),
               *(f"--{key}={v}" for key, v in timing.items()),
               *([f"--jitter-ms={jitter_ms}"] if path.startswith("jitter") else []),
               *([f"--idle={idle}"] if idle and idle_by == "client" else [])]
        procs.append((path, cpu, out, subprocess.Popen(cmd, preexec_fn=lambda c=cpu: os.sched_setaffinity(0, {c}))))
        if idle and idle_by == "holder":
            held = out.with_suffix(".held.json")  # --conc 0: hold the idle connections, nothing else
            holder = list(cmd)
            holder[holder.index("--conc") + 1], holder[holder.index("--out") + 1] = "0", str(held)
            holders.append((path, held, subprocess.Popen(
                [*holder, f"--idle={idle}"], preexec_fn=lambda c=cpu: os.sched_setaffinity(0, {c}))))
    window_in = t0 + timing["warmup"] - time.monotonic()
    spies = profile(w, pids, f"c{conc}-p{n}", window_in, timing["window"]) if prof else {}
    row: dict[str, Any] = {"conc": conc, "pass": n, "kind": kind, "drain_s": drained, "timing": timing, "sides": {}}
    if kind[0] == "j":
        row["jitter_ms"] = jitter_ms
    if pinned:
        row["pin"] = pinned
    if direct_idle:
        row["direct_idle"] = direct_idle
        if idle_by == "holder":
            row["idle_by"] = idle_by
    for path, cpu, out, proc in procs:
        rc = proc.wait()
        row["sides"][path] = {**(json.loads(out.read_text()) if rc == 0 else {"rc": rc}), "client_cpu": cpu}
    for path, held, proc in holders:
        rc = proc.wait()
        row["sides"][path].update(json.loads(held.read_text()) if rc == 0 else {"holder_rc": rc})
    span = time.monotonic() - t0
    samples = sampler.stop()
    if prof:
        row["prof"] = collect(spies)
    start = timing["warmup"]
    # each side's instance, its requests and the gateway's connections to it, over the window
    row["in_vllm"] = {path: means(samples[instance(path)], start, start + timing["window"]) for path in row["sides"]}
    # and each side's means by vLLM's own clocks, to set beside the client's
    row["vllm_clock"] = {path: vllm_means(samples[instance(path)], start, start + timing["window"])
                         for path in row["sides"]}
    # and its engine's steps, and its processes' CPU
    row["engine"] = {path: engine(samples[instance(path)], start, start + timing["window"]) for path in row["sides"]}
    row["samples"] = samples
    roles = {p.pid: "direct" for path, _, _, p in procs if path.startswith("direct")}
    roles |= {p.pid: "holder" for _, _, p in holders}
    roles |= {p: "gateway" for p in ([gw_pid, *descendants(gw_pid)] if gw_pid else [])}
    row["api_split"] = split.result(roles)  # api_split.py: connections and CPU by vLLM process
    if gw_pid and cpu0 is not None and (cpu1 := cpu_seconds(gw_pid)) is not None:
        row["gateway_cpu_share"] = round((cpu1 - cpu0) / span, 3)
    row["queued"] = int(_sum(_QUEUED, GW + "/metrics") - queued0)
    print(f"c{conc} p{n} {kind}: " + "; ".join(
        f"{p} {s.get('output_throughput')} tok/s, TTFT p50 {s.get('median_ttft_ms')} ms, "
        f"head p50 {s.get('median_head_ms')} ms, in flight {s.get('mean_in_flight')}, "
        f"in vLLM {row['in_vllm'][p]}, by vLLM's clocks {row['vllm_clock'][p]}"
        for p, s in row["sides"].items()) + f"; queued {row['queued']}", flush=True)
    return row


def run(model_dir: str, w: Path, concs: list[int], passes: int, timing: dict[str, float],
        kinds: list[str], jitter_ms: float = 0.0, prof: bool = False, direct_idle: int = 512) -> list[dict[str, Any]]:
    rows_path = w / "rows.json"
    rows: list[dict[str, Any]] = json.loads(rows_path.read_text()) if rows_path.exists() else []
    clients = json.loads((w / CLIENT_CPUS).read_text())
    for conc in concs:
        done = sum(1 for r in rows if r["conc"] == conc)  # a second run goes on with the cycle
        for n in range(done, done + passes):
            kind, apart, idle_by = split_kind(kinds[(n - done) % len(kinds)])
            rows.append(one(model_dir, w, kind, conc, n, clients, timing, jitter_ms, apart=apart, prof=prof,
                            direct_idle=direct_idle if idle_by else 0, idle_by=idle_by or "client"))
            rows_path.write_text(json.dumps(rows, indent=1))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("phase", choices=["start", "run", "stop"])
    ap.add_argument("--model-dir", default="/tmp/tiny-model")
    ap.add_argument("--out", required=True)
    ap.add_argument("--conc", type=int, nargs="+", default=[1024])
    ap.add_argument("--passes", type=int, default=6, help="run: passes per concurrency, cycling through --kinds")
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help="run: the kinds of pass to cycle through, in order; gbp, gap...: with the engines apart")
    ap.add_argument("--warmup", type=float, default=10.0, help="run: seconds of load before the window")
    ap.add_argument("--window", type=float, default=30.0, help="run: seconds measured")
    ap.add_argument("--tail", type=float, default=8.0, help="run: seconds of load after it, for late first tokens")
    ap.add_argument("--ramp", type=float, default=0.0, help="run: seconds over which each side's streams start")
    ap.add_argument("--jitter-ms", type=float, default=50.0, help="run: the jitter side's pause before each request")
    ap.add_argument("--direct-idle", type=int, default=512,
                    help="run: in a pass whose kind ends in i (gbi, gai), each direct side's client also holds this "
                    "many idle connections to its instance, as the gateway's warm pool does; in h (gbh, gah) a "
                    "process of their own holds them")
    ap.add_argument("--profile", action="store_true",
                    help="run: py-spy on each instance's API server and engine core over the window (prof.py)")
    ap.add_argument("--vllm-args", help="start: each instance's vLLM arguments, in place of --enforce-eager "
                    "--max-model-len 2048 (e.g. '--max-model-len 2048': vLLM's default CUDA graphs and compilation)")
    ap.add_argument("--vllm-command", help="start: the fleet file's vllm_command, e.g. 'python -m "
                    "vllm.entrypoints.cli.main serve' (`vllm serve`: --api-server-count above 1 in --vllm-args)")
    a = ap.parse_args()
    w = Path(a.out)
    w.mkdir(parents=True, exist_ok=True)
    if a.phase == "start":
        res: Any = start(a.model_dir, w, None if a.vllm_args is None else a.vllm_args.split(),
                         None if a.vllm_command is None else a.vllm_command.split())
    elif a.phase == "run":
        kinds = a.kinds.split(",")
        if not kinds or {split_kind(k)[0] for k in kinds} - set(KINDS):
            ap.error(f"--kinds: each of {', '.join(KINDS)}, not {a.kinds!r}")
        timing = {"warmup": a.warmup, "window": a.window, "tail": a.tail, "ramp": a.ramp}
        res = run(a.model_dir, w, a.conc, a.passes, timing, kinds, a.jitter_ms, a.profile, a.direct_idle)
        print(report(res))
    else:
        res = stop(w)
        if (w / "rows.json").exists():
            print(report(json.loads((w / "rows.json").read_text())))
    (w / f"{a.phase}.json").write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
