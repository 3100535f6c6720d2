"""What vLLM's load gauges say after a burst of streams is cut, and what the gateway makes of them
(issue 21's "gauges above 0 after cut streams").

    python3 bench/gpu/cut_gauges.py start --out W --model-dir M [--vllm-command ...] [--vllm-args ...]
    python3 bench/gpu/cut_gauges.py run --out W --model-dir M --trials 4 [--kinds d,g]
    python3 bench/gpu/cut_gauges.py stop --out W
    python3 bench/gpu/cut_gauges.py report ROWS...

Why: with two vLLM API servers an instance (``--api-server-count 2``), the twin and pick runs
waited out their 20 or 60 s for ``vllm:num_requests_running`` and ``_waiting`` to read 0 before
about a third of their passes, after direct passes as well as the gateway's; with one API server
they read 0 within 2 s every time. The gateway's ``load_aware`` and ``prefix_aware`` policies read
those gauges (gateway/loadscrape.py), so a stale figure is load that is not there.

``start``: ``vllm-fleet up`` with instance ``a`` on GPU 0 and its gateway on ``load_aware``
(``FLEET_ROUTING_POLICY``), so that its /fleet shows the load it reads. Each trial (``run``):

1. a closed loop of ``--conc`` streams (window_client.py) for ``--load-s`` seconds, straight to
   the instance (``d``) or through the gateway (``g``), then every stream closed at once;
2. every ``--every`` seconds for ``--watch`` seconds (stopping 3 s after both gauges read 0): each
   ``num_requests_running`` / ``_waiting`` line of the instance's /metrics as written (label sets
   apart), its generation and prompt token counters, and the load the gateway holds for it;
3. if the gauges still read above 0: one short request straight to the instance, 5 s of samples,
   then 8 at once, 5 s more: what clears them.

``start --sleep`` gives the instance vLLM's sleep mode (level 1, awake after start-up), and ``run
--then-sleep always|stuck`` replaces step 3: the admin API puts the instance to sleep (after every
trial, or only where the gauges stuck) and the trial times it, then wakes it. With stuck gauges the
drain must end on flat counters after ``supervisor.drain_stalled_s`` (``start --drain-stalled-s``).
``run --files`` also keeps each API server's own gauge values at the end of each watch, with the
time each was set: which one /metrics showed (both in cut_sleep.py).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cut_sleep import gauge_files, sleep_cycle
from detached_up import launch_up, stop
from gpu_fleet import GW, base_fleet, fleet_healthy, inst, instances, wait
from pin import cores
from twin_stats import load as load_rows

HERE = Path(__file__).resolve().parent
PORT = 8001
DIRECT = f"http://127.0.0.1:{PORT}"
_GAUGE = re.compile(r"^vllm:num_requests_(running|waiting)(\{[^}]*\})? (\S+)$", re.M)
_COUNTER = re.compile(r"^vllm:(generation|prompt)_tokens_total(\{[^}]*\})? (\S+)$", re.M)


def start(model_dir: str, w: Path, vllm_args: list[str] | None, vllm_command: list[str] | None,
          sleep: bool = False, drain_stalled_s: float | None = None) -> dict[str, Any]:
    fleet = {**base_fleet(w), "instances": [{**inst("a", model_dir, [0], ["tiny-a"], PORT),
                                             "gpu_memory_utilization": 0.5}]}
    if sleep:
        fleet["instances"][0]["sleep"] = {"level": 1, "preload": True}
    if drain_stalled_s is not None:
        fleet["supervisor"]["drain_stalled_s"] = drain_stalled_s
    if vllm_command is not None:
        fleet["vllm_command"] = vllm_command
    if vllm_args is not None:
        fleet["instances"][0]["vllm_args"] = vllm_args
    took = launch(w, fleet, 420)
    return {"up_to_ready_s": round(took, 1), "vllm_args": fleet["instances"][0]["vllm_args"],
            "vllm_command": fleet.get("vllm_command"), "sleep": sleep,
            "drain_stalled_s": fleet["supervisor"].get("drain_stalled_s")}


def launch(w: Path, fleet: dict[str, Any], timeout: float) -> float:
    """``up`` on ``fleet`` with its gateway on ``load_aware``, on every CPU group but the last (the
    client's, W/client-cpu.json): seconds until every instance is in rotation."""
    groups = cores()
    (w / "client-cpu.json").write_text(json.dumps(groups[-1][0]))
    os.environ["FLEET_ROUTING_POLICY"] = "load_aware"
    launch_up(w, fleet, {c for g in groups[:-1] for c in g})
    names = [i["name"] for i in fleet["instances"]]
    return wait(lambda: fleet_healthy(names) and len(instances()) == len(names) + 1, timeout,  # + the gateway
                f"{', '.join(names)} in rotation")


def sample(t0: float) -> dict[str, Any]:
    """One look at the instance's gauges and counters, and at the gateway's view of its load."""
    s: dict[str, Any] = {"t": round(time.monotonic() - t0, 2)}
    try:
        text = httpx.get(DIRECT + "/metrics", timeout=5).text
    except httpx.HTTPError as e:
        return {**s, "error": repr(e)}
    s["gauges"] = [[m[0], m[1] or "", float(m[2])] for m in _GAUGE.findall(text)]
    s["busy"] = sum(v for _, _, v in s["gauges"])
    s["tokens"] = {k: sum(float(v) for kind, _, v in _COUNTER.findall(text) if kind == k)
                   for k in ("generation", "prompt")}
    try:
        backends = httpx.get(GW + "/fleet", timeout=5).json()["backends"]
        s["gateway_load"] = next((b.get("load") for b in backends if b["name"] == "a"), None)
    except (httpx.HTTPError, ValueError, KeyError):
        s["gateway_load"] = None
    return s


def watch(t0: float, seconds: float, every: float, settle: float = 3.0) -> list[dict[str, Any]]:
    """Samples until ``seconds`` have passed, or ``settle`` seconds after the gauges read 0."""
    out: list[dict[str, Any]] = []
    zero_since: float | None = None
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        s = sample(t0)
        out.append(s)
        if s.get("busy") == 0:
            zero_since = zero_since or time.monotonic()
            if time.monotonic() - zero_since >= settle:
                break
        else:
            zero_since = None
        time.sleep(every)
    return out


def short(n: int) -> list[int]:
    """``n`` short completions at once, straight to the instance; their status codes."""
    def one(_: int) -> int:
        body = {"model": "tiny-a", "prompt": "hello", "max_tokens": 4}
        return httpx.post(DIRECT + "/v1/completions", json=body, timeout=60).status_code
    with concurrent.futures.ThreadPoolExecutor(n) as ex:
        return list(ex.map(one, range(n)))


def trial(model_dir: str, w: Path, kind: str, n: int, a: argparse.Namespace,
          on_stuck: Callable[[float], dict[str, Any]] | None = None) -> dict[str, Any]:
    """One cut and its watch; then, where the gauges stuck, ``on_stuck(cut)`` (cut_pair.py) if given."""
    client = json.loads((w / "client-cpu.json").read_text())
    before = sample(time.monotonic())
    t0 = time.monotonic() + 3.0
    out = w / "sides" / f"t{n}.json"
    out.parent.mkdir(exist_ok=True)
    cmd = [sys.executable, str(HERE / "window_client.py"), "--base", DIRECT if kind == "d" else GW,
           "--model", "tiny-a", "--tokenizer", model_dir, "--conc", str(a.conc), "--t0", str(t0),
           "--warmup", "0", "--window", str(a.load_s), "--tail", "0", "--seed", str(7000 + n), "--out", str(out)]
    proc = subprocess.Popen(cmd, preexec_fn=lambda: os.sched_setaffinity(0, {client}))
    during: list[dict[str, Any]] = []  # the gateway's view under load: a stall here would be a false one

    def look() -> None:
        while proc.poll() is None:
            during.append(sample(t0))
            time.sleep(1.0)
    looker = threading.Thread(target=look)
    looker.start()
    rc = proc.wait()
    looker.join()
    cut = time.monotonic()
    row: dict[str, Any] = {"trial": n, "kind": kind, "conc": a.conc, "load_s": a.load_s, "client_rc": rc,
                           "before": before, "during_load": during, "after_cut": watch(cut, a.watch, a.every)}
    side = json.loads(out.read_text()) if rc == 0 else {}
    row["side"] = {k: side.get(k) for k in ("output_throughput", "median_ttft_ms", "errors", "mean_in_flight")}
    stuck = row["after_cut"][-1].get("busy", 0) > 0
    if a.files:
        try:
            row["gauge_files"] = gauge_files()
        except (ImportError, OSError, ValueError, RuntimeError) as e:
            row["gauge_files"] = repr(e)
    if on_stuck is not None:
        if stuck:
            row["on_stuck"] = on_stuck(cut)
    elif a.then_sleep == "always" or (a.then_sleep == "stuck" and stuck):
        row["sleep_cycle"] = {"at_ask": sample(cut), **sleep_cycle(w, a.every)}
    elif stuck and not a.then_sleep:
        row["poke_1"] = {"status": short(1), "samples": watch(cut, 5.0, a.every, settle=1.0)}
        row["poke_8"] = {"status": short(8), "samples": watch(cut, 5.0, a.every, settle=1.0)}
    row["summary"] = summary(row)
    print(f"trial {n} {kind}: {json.dumps(row['summary'])}", flush=True)
    return row


def summary(row: dict[str, Any]) -> dict[str, Any]:
    """When the gauges first read 0 after the cut (None: not within the watch), the figure they
    stuck at, whether the token counters moved while they did, and what cleared them."""
    after = [s for s in row["after_cut"] if "busy" in s]
    zero = next((s["t"] for s in after if s["busy"] == 0), None)
    stuck = [s for s in after if s["t"] >= 5.0 and s["busy"] > 0]
    out: dict[str, Any] = {"zero_at_s": zero, "watched_s": after[-1]["t"] if after else None,
                           "busy_at_end": after[-1]["busy"] if after else None,
                           "stalled_under_load": sum(bool((s.get("gateway_load") or {}).get("stalled"))
                                                     for s in row.get("during_load", [])),
                           "gateway_stalled_at_s": next((s["t"] for s in after
                                                         if (s.get("gateway_load") or {}).get("stalled")), None)}
    if stuck:
        first, last = stuck[0], stuck[-1]
        out["stuck_busy"] = sorted({s["busy"] for s in stuck})[:6]
        out["stuck_lines"] = [g for g in last["gauges"] if g[2] > 0]
        out["tokens_moved_while_stuck"] = {k: last["tokens"][k] - first["tokens"][k] for k in first["tokens"]}
        out["gateway_load_at_end"] = last.get("gateway_load")
    if "sleep_cycle" in row:
        c = row["sleep_cycle"]
        out["sleep"] = {"busy_at_ask": c["at_ask"].get("busy"), "asleep_s": c["asleep_after_s"],
                        "running_again_s": c["running_after_s"],
                        "drain_on_flat_counters": any("drained: vLLM" in line for line in c["up_said"])}
    for poke in ("poke_1", "poke_8"):
        if poke in row:
            s = [x for x in row[poke]["samples"] if "busy" in x]
            out[f"busy_after_{poke}"] = s[-1]["busy"] if s else None
    return out


def more_rows(w: Path, trials: int, one: Callable[[int, list[dict[str, Any]]], dict[str, Any]]) -> list[dict[str, Any]]:
    """``trials`` more rows after those in W/rows.json, each ``one(n, the rows so far)``, saved after each."""
    path = w / "rows.json"
    rows: list[dict[str, Any]] = json.loads(path.read_text()) if path.exists() else []
    for n in range(len(rows), len(rows) + trials):
        rows.append(one(n, rows))
        path.write_text(json.dumps(rows, indent=1))
    return rows


def report(rows: list[dict[str, Any]]) -> str:
    lines = ["| trial | path | first 0 after the cut, s | stuck at (5 s on) | token counters moved while stuck | "
             "the gateway's load for it at the end | the gateway calls it stalled at, s | stalled under load "
             "(samples) | after 1 request | after 8 more | sleep asked: SLEEPING after, s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s = r["summary"]
        moved = s.get("tokens_moved_while_stuck")
        lines.append(
            f"| {r['trial']} | {'direct' if r['kind'] == 'd' else 'gateway'} | "
            f"{s['zero_at_s'] if s['zero_at_s'] is not None else 'not in ' + str(s['watched_s'])} | "
            f"{s.get('stuck_busy', '-')} | {moved if moved is not None else '-'} | "
            f"{_brief(s.get('gateway_load_at_end')) if 'stuck_busy' in s else '-'} | "
            f"{s.get('gateway_stalled_at_s', '-')} | {s.get('stalled_under_load', '-')} of "
            f"{len(r.get('during_load', []))} | {s.get('busy_after_poke_1', '-')} | "
            f"{s.get('busy_after_poke_8', '-')} | {_slept(s.get('sleep'))} |")
    return "\n".join(lines)


def _slept(sleep: dict[str, Any] | None) -> str:
    if not sleep:
        return "-"
    return f"{sleep['asleep_s']}" + (" (drained on flat counters)" if sleep["drain_on_flat_counters"] else "")


def _brief(load: dict[str, Any] | None) -> str:
    if not load:
        return "-"
    return f"running {load['running']:g}, waiting {load['waiting']:g}" + (
        f", stalled {load['stalled']}" if "stalled" in load else "")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("phase", choices=["start", "run", "stop", "report"])
    ap.add_argument("rows", nargs="*", help="report: rows.json files (.gz too)")
    ap.add_argument("--model-dir", default="/tmp/tiny-model")
    ap.add_argument("--out", default="/tmp/cut")
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--kinds", default="d,g", help="run: the paths to cycle through (d direct, g gateway)")
    ap.add_argument("--conc", type=int, default=512)
    ap.add_argument("--load-s", type=float, default=20.0)
    ap.add_argument("--watch", type=float, default=90.0)
    ap.add_argument("--every", type=float, default=0.5)
    ap.add_argument("--vllm-args", help="start: the instance's vLLM arguments")
    ap.add_argument("--vllm-command", help="start: the fleet file's vllm_command")
    ap.add_argument("--sleep", action="store_true", help="start: vLLM's sleep mode for the instance")
    ap.add_argument("--drain-stalled-s", type=float, help="start: supervisor.drain_stalled_s")
    ap.add_argument("--files", action="store_true", help="run: after each watch, each API server's own gauge values")
    ap.add_argument("--then-sleep", choices=["always", "stuck"],
                    help="run: sleep and wake the instance after each watch, or only when the gauges stuck")
    a = ap.parse_args(argv)
    if a.phase == "report":
        print(report(load_rows(a.rows)))
        return
    w = Path(a.out)
    w.mkdir(parents=True, exist_ok=True)
    res: Any
    if a.phase == "start":
        res = start(a.model_dir, w, a.vllm_args.split() if a.vllm_args else None,
                    a.vllm_command.split() if a.vllm_command else None, a.sleep, a.drain_stalled_s)
    elif a.phase == "run":
        kinds = a.kinds.split(",")
        if set(kinds) - {"d", "g"}:
            ap.error(f"--kinds: each of d, g, not {a.kinds!r}")
        res = more_rows(w, a.trials, lambda n, _: trial(a.model_dir, w, kinds[n % len(kinds)], n, a))
        print(report(res))
    else:
        res = stop(w)
    (w / f"{a.phase}.json").write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
