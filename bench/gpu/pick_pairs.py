"""Which idle connection the gateway's pool should take, measured on one GPU (issue 21).

    python3 bench/gpu/pick_pairs.py start --out W --model-dir M [--vllm-command ...] [--vllm-args ...]
    python3 bench/gpu/pick_pairs.py run --out W --model-dir M --conc 512 --passes 6 --kinds d,g,r,r,g,d
    python3 bench/gpu/pick_pairs.py stop --out W
    python3 bench/gpu/pick_pairs.py report [--conc C] ROWS...   # here: the table by kind (runs pooled)

``run --ramp R`` starts each pass's streams one by one over R s instead of together, to test
whether the slow mode at 512 under vLLM's defaults is set by how the first requests, all started at
once, drain 5-10 s in (twin_onset.py, results/pick-defaults2-h200). ``--ramp 10,0`` takes the ramps
in turn, one per cycle of ``--kinds``, so that both starts share the run's drift; ``report --ramp R``
reads only the passes with that ramp. results/pick-ramp-h200 (a pilot) and pick-ramp2-h200 ran it:
the ramp did not take the slow mode away.

Why: with two API servers an instance, the twin runs put 0.2 % of the gateway's first tokens past
1.2 s under the LIFO pick, 10.9-15 % under a random one and 0.4 % direct (api_split.py), but each
pick ran on another machine on another day. Here the picks alternate on one machine and one
instance. ``a`` runs on GPU 0 under ``vllm-fleet up``, whose own gateway holds no warm pool
(``FLEET_UPSTREAM_WARM=false``, so it leaves vLLM no idle connections of its own); beside it runs
the same gateway on the same config (gateway_variant.py ``--variant switch``, port 8081, on the
fleet gateway's CPUs) with its warm pool, whose pick a signal switches. Passes run one at a time,
a closed loop of ``--conc`` streams each (window_client.py, on a core ``up`` does not use):

- ``d``: direct to a (the gateway's pool idle beside it, as in the twin runs);
- ``g``: through the gateway, the pick as shipped (the most recently used idle connection on the
  API server with the fewest busy ones);
- ``r``: through the same gateway, an idle connection at random (e437f7c's pick, the pool still
  evened out over the API servers).

``g`` and ``r`` share one pool, its connections and its balancing: only the pick differs. Each row
has twin_pairs.py's fields for its one side (``direct:a``, ``gateway:a`` or ``random:a``), so
api_split.py reads them too.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from api_split import Recorder, windows
from bench_clients import cpu_seconds
from detached_up import launch_up, stop
from gpu_fleet import base_fleet, fleet_healthy, inst, instances, wait
from in_pass import Sampler, descendants, engine, means, vllm_means
from pair_stats import neighbours
from pin import cores
from twin_pairs import drain
from twin_stats import load, ramped
from twin_versus import rank_sum_p

HERE = Path(__file__).resolve().parent
PORT, VARIANT_PORT = 8001, 8081
DIRECT, VARIANT = f"http://127.0.0.1:{PORT}", f"http://127.0.0.1:{VARIANT_PORT}"
ROLES = {"d": "direct", "g": "gateway", "r": "random"}
SIGNALS = {"g": signal.SIGUSR2, "r": signal.SIGUSR1}  # gateway_variant.py's switch


def start(model_dir: str, w: Path, vllm_args: list[str] | None, vllm_command: list[str] | None) -> dict[str, Any]:
    """``up`` with instance a on GPU 0 (half its memory, as each twin instance had), then the
    switchable gateway on up's gateway's CPUs, until its pool holds the instance's max_num_seqs."""
    fleet = {**base_fleet(w), "instances": [{**inst("a", model_dir, [0], ["tiny-a"], PORT),
                                             "gpu_memory_utilization": 0.5}]}
    if vllm_command is not None:
        fleet["vllm_command"] = vllm_command
    if vllm_args is not None:
        fleet["instances"][0]["vllm_args"] = vllm_args
    groups = cores()
    if len(groups) < 3:
        raise SystemExit(f"pick passes need 3 physical cores (the client, the gateway, vLLM), not {len(groups)}")
    client = groups[-1][0]
    (w / "client-cpu.json").write_text(json.dumps(client))
    os.environ["FLEET_UPSTREAM_WARM"] = "false"  # up's gateway: no pool of its own at vLLM
    launch_up(w, fleet, {c for g in groups[:-1] for c in g})
    took = wait(lambda: fleet_healthy(["a"]) and len(instances()) == 2, 420, "instance a in rotation")
    gw_cpus = os.sched_getaffinity(instances()["gateway"]["pid"])
    config = Path(fleet["supervisor"]["state_dir"]) / "infernet.json"  # up's, for its gateway
    env = {**os.environ, "FLEET_UPSTREAM_WARM": "true"}
    log = open(w / "variant.log", "ab")  # noqa: SIM115 - handed to the child
    variant = subprocess.Popen(
        [sys.executable, str(HERE / "gateway_variant.py"), "--port", str(VARIANT_PORT), "--variant", "switch",
         "--config", str(config)],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=lambda: os.sched_setaffinity(0, gw_cpus))
    (w / "variant.pid").write_text(str(variant.pid))
    listed = json.loads(config.read_text()).get("vllm_instances", [])
    want = next((i.get("max_num_seqs") or 0 for i in listed), 0)  # warm.py's pool
    wait(lambda: _pool(VARIANT).get("idle", 0) >= want, 120, f"the gateway's pool warm ({want})")
    return {"up_to_ready_s": round(took, 1), "gateway_cpus": sorted(gw_cpus), "client_cpu": client,
            "vllm_args": fleet["instances"][0]["vllm_args"], "vllm_command": fleet.get("vllm_command"),
            "variant_fleet": httpx.get(VARIANT + "/fleet", timeout=5).json()}


def _pool(base: str) -> dict[str, Any]:
    try:
        backends = httpx.get(base + "/fleet", timeout=2).json()["backends"]
    except (httpx.HTTPError, ValueError, KeyError):
        return {}
    return next((b.get("connections", {}) for b in backends if b["name"] == "a"), {})


def one(model_dir: str, w: Path, kind: str, conc: int, n: int, client: int, timing: dict[str, float],
        variant: int) -> dict[str, Any]:
    if kind in SIGNALS:
        os.kill(variant, SIGNALS[kind])
    a_pid = instances()["a"]["pid"]
    path = f"{ROLES[kind]}:a"
    drained = drain(20.0, [PORT])
    cpu0 = cpu_seconds(variant)
    t0 = time.monotonic() + 3.0  # the client imports and connects before it
    start, end = timing["warmup"], timing["warmup"] + timing["window"]
    sampler = Sampler({"a": DIRECT}, VARIANT, t0, pids={"a": a_pid}, gpus={"a": 0})
    sampler.start()
    split = Recorder({"a": PORT}, {"a": a_pid}, t0 + start, t0 + end)
    split.start()
    (w / "sides").mkdir(exist_ok=True)
    out = w / "sides" / f"c{conc}-p{n}.json"
    cmd = [sys.executable, str(HERE / "window_client.py"), "--base", DIRECT if kind == "d" else VARIANT,
           "--model", "tiny-a", "--tokenizer", model_dir, "--conc", str(conc), "--t0", str(t0),
           "--seed", str(1000 * n), "--out", str(out), *(f"--{key}={v}" for key, v in timing.items())]
    proc = subprocess.Popen(cmd, preexec_fn=lambda: os.sched_setaffinity(0, {client}))
    rc = proc.wait()
    span = time.monotonic() - t0
    samples = sampler.stop()
    # the gateway's pool is "gateway" in a direct pass too (api_split.py's pool column)
    roles = {p: ROLES[kind] if kind in SIGNALS else "gateway" for p in [variant, *descendants(variant)]}
    if kind == "d":
        roles[proc.pid] = "direct"
    cpu1 = cpu_seconds(variant)
    row: dict[str, Any] = {"conc": conc, "pass": n, "kind": kind, "drain_s": drained, "timing": timing,
           "sides": {path: json.loads(out.read_text()) if rc == 0 else {"rc": rc}},
           "in_vllm": {path: means(samples["a"], start, end)},
           "vllm_clock": {path: vllm_means(samples["a"], start, end)},
           "engine": {path: engine(samples["a"], start, end)}, "samples": samples,
           "api_split": split.result(roles), "pool_after": _pool(VARIANT),
           "gateway_cpu_share": round((cpu1 - cpu0) / span, 3) if cpu0 is not None and cpu1 is not None else None}
    s = row["sides"][path]
    print(f"c{conc} p{n} {kind}: {s.get('output_throughput')} tok/s, TTFT p50 {s.get('median_ttft_ms')} ms, "
          f"p99 {s.get('p99_ttft_ms')} ms, in flight {s.get('mean_in_flight')}, errors {s.get('errors')}, "
          f"engine {row['engine'][path]}", flush=True)
    return row


def run(model_dir: str, w: Path, conc: int, passes: int, timing: dict[str, float], kinds: list[str],
        ramps: list[float]) -> list[Any]:
    """``passes`` more passes, going on with the cycle of ``kinds``; each whole cycle takes the next
    of ``ramps`` (0: the streams start together), so that a run cut short anywhere still holds
    both starts in about equal numbers, each cycle's pairs under one start."""
    rows_path = w / "rows.json"
    rows: list[dict[str, Any]] = json.loads(rows_path.read_text()) if rows_path.exists() else []
    client = json.loads((w / "client-cpu.json").read_text())
    variant = int((w / "variant.pid").read_text())
    done = len(rows)  # a second run goes on with the cycle
    for n in range(done, done + passes):
        ramp = ramps[n // len(kinds) % len(ramps)]
        timed = {**timing, **({"ramp": ramp} if ramp else {})}
        rows.append(one(model_dir, w, kinds[n % len(kinds)], conc, n, client, timed, variant))
        rows_path.write_text(json.dumps(rows, indent=1))
    return rows


def finish(w: Path) -> dict[str, Any]:
    """The switchable gateway by its PID (SIGTERM, SIGKILL after 10 s), then `up` (detached_up.stop)."""
    pid = int((w / "variant.pid").read_text())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
            for _ in range(100):
                time.sleep(0.1)
                os.kill(pid, 0)
        except ProcessLookupError:
            return {"variant_ended_by": sig.name, **stop(w)}
    return {"variant_ended_by": None, **stop(w)}


MEASURES = (("tokens/s", "output_throughput"), ("TTFT p50 ms", "median_ttft_ms"), ("TTFT p99 ms", "p99_ttft_ms"))


def report(rows: list[dict[str, Any]], late_ms: float = 1200.0) -> str:
    """By kind of pass: each measure's median (range), the share of first tokens later than
    ``late_ms``, the busier API server's share of the side's active connections, tokens an engine
    step; then g against r and each against d by rank sum."""
    by_pass = {w["pass"]: w for w in windows(rows, late_ms)}
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        side = next(iter(r["sides"].values()))
        if "rc" in side or r["pass"] not in by_pass:
            continue
        w = by_pass[r["pass"]]
        by.setdefault(r["kind"], []).append({**{k: side[k] for _, k in MEASURES}, "late": w["late"],
                                             "busier": w["busier_share"], "step": w["tokens_per_step"],
                                             "active": sum(p[0] for p in w["procs"])})
    cols = [*MEASURES, (f"TTFT > {late_ms:g} ms", "late"), ("busier API server", "busier"), ("tokens a step", "step"),
            ("connections active", "active")]
    lines = ["| pass | n | " + " | ".join(c for c, _ in cols) + " |", "|---|---|" + "---|" * len(cols)]
    for kind in ("d", "g", "r"):
        got = by.get(kind, [])
        if got:
            figures = (_cell([x[k] for x in got], k) for _, k in cols)
            lines.append(f"| {ROLES[kind]} | {len(got)} | " + " | ".join(figures) + " |")
    pairs = (("g", "d"), ("r", "d"), ("g", "r"))
    lines += ["", "| measure | " + " | ".join(f"{a} ÷ {b}: medians, rank-sum p" for a, b in pairs) + " |",
              "|---|---|---|---|"]
    for name, key in [*MEASURES, (cols[3][0], "late")]:
        cells = []
        for a, b in pairs:
            xs, ys = ([x[key] for x in by.get(k, []) if x[key] is not None] for k in (a, b))
            mid = statistics.median(ys) if ys else 0
            cells.append(f"{statistics.median(xs) / mid:.3f}, p = {rank_sum_p(xs, ys):.3f}" if xs and mid else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines + neighbours(rows, MEASURES))


def _cell(xs: list[float | None], key: str) -> str:
    vals = sorted(x for x in xs if x is not None)
    if not vals:
        return "-"
    f = "{:.1%}" if key in ("late", "busier") else "{:.2f}" if key == "step" else "{:.0f}"
    return f"{f.format(statistics.median(vals))} ({f.format(vals[0])}–{f.format(vals[-1])})"


def pooled(files: list[str]) -> list[dict[str, Any]]:
    """The rows of several runs as one run (twin_stats.load, in file order): each file's passes
    numbered on after the last file's, from an even number, so that neighbours() pairs passes of
    one run only."""
    rows: list[dict[str, Any]] = []
    start: dict[int, int] = {}
    for r in load(files):
        if r["_file"] not in start:
            start[r["_file"]] = (max((x["pass"] for x in rows), default=-1) + 2) // 2 * 2
        rows.append({**r, "pass": r["pass"] + start[r["_file"]]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("phase", choices=["start", "run", "stop", "report"])
    ap.add_argument("rows", nargs="*", help="report: rows.json files (.gz too)")
    ap.add_argument("--model-dir", default="/tmp/tiny-model")
    ap.add_argument("--out", default="/tmp/pick")
    ap.add_argument("--conc", type=int, help="run: streams a pass (512); report: only the passes at this many")
    ap.add_argument("--passes", type=int, default=6)
    ap.add_argument("--kinds", default="d,g,r,r,g,d", help="run: the kinds of pass to cycle through (d, g, r)")
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--window", type=float, default=30.0)
    ap.add_argument("--tail", type=float, default=10.0)
    ap.add_argument("--ramp",
                    help="run: seconds over which a pass's streams start, one by one (window_client.py's); "
                    "several, comma-separated, for one each cycle of --kinds in turn. report: only the passes "
                    "with this ramp")
    ap.add_argument("--late-ms", type=float, default=1200.0, help="report: a first token later than this is late")
    ap.add_argument("--vllm-args", help="start: the instance's vLLM arguments (twin_pairs.py's)")
    ap.add_argument("--vllm-command", help="start: the fleet file's vllm_command (twin_pairs.py's)")
    a = ap.parse_intermixed_args()
    try:
        ramps = [float(x) for x in (a.ramp or "0").split(",")]
    except ValueError:
        ap.error(f"--ramp: seconds, comma-separated, not {a.ramp!r}")
    if a.phase == "report":
        if len(ramps) > 1:
            ap.error(f"report --ramp: one ramp, not {a.ramp!r}")
        rows = [r for r in pooled(a.rows) if a.conc is None or r["conc"] == a.conc]
        print(report(rows if a.ramp is None else ramped(rows, ramps[0]), a.late_ms))
        return
    w = Path(a.out)
    w.mkdir(parents=True, exist_ok=True)
    res: Any
    if a.phase == "start":
        res = start(a.model_dir, w, a.vllm_args.split() if a.vllm_args else None,
                    a.vllm_command.split() if a.vllm_command else None)
    elif a.phase == "run":
        kinds = a.kinds.split(",")
        if not kinds or set(kinds) - set(ROLES):
            ap.error(f"--kinds: each of d, g, r, not {a.kinds!r}")
        if max(ramps) > a.warmup:  # streams still starting inside the window would be measured half-loaded
            ap.error(f"--ramp {a.ramp}: each at most the warm-up ({a.warmup:g} s)")
        timing = {"warmup": a.warmup, "window": a.window, "tail": a.tail}
        res = run(a.model_dir, w, a.conc or 512, a.passes, timing, kinds, ramps)
        print(report(res))
    else:
        res = finish(w)
        if (w / "rows.json").exists():
            print(report(json.loads((w / "rows.json").read_text())))
    (w / f"{a.phase}.json").write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
