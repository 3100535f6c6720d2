"""Two replicas of one model on one GPU, one of them left with vLLM's stuck load gauges: what the
gateway's ``load_aware`` routing and the supervisor's drain then do with it, on real vLLM (issue 21;
tests/test_routing_live.py shows the routing with fake vLLMs).

    python3 bench/gpu/cut_pair.py start --out W --model-dir M [--vllm-command ...] [--vllm-args ...]
    python3 bench/gpu/cut_pair.py run --out W --model-dir M --trials 12 [--on-stuck route,restart]
    python3 bench/gpu/cut_pair.py stop --out W
    python3 bench/gpu/cut_pair.py report ROWS...

``start``: ``vllm-fleet up`` with instances a (port 8001) and b (8002) on GPU 0, each serving
``tiny`` (and ``tiny-a`` / ``tiny-b``), each with a ``sleep:`` block awake from start-up (the fleet
file lets instances share a GPU only so), the gateway on ``load_aware``. Each trial is
cut_gauges.py's: ``--conc`` streams straight to a for ``--load-s`` seconds, all cut at once, a's
gauges watched. Where they stuck (about one cut in six, bench/gpu/results/cut-gauges-h200), the
trial waits for the gateway to call a stalled (its /fleet and ``fleet_backend_load_stalled``), then
takes the next of ``--on-stuck``'s steps in turn:

- ``route``: ``--requests`` short completions of ``tiny``, one at a time, through the gateway; the
  replica of each (``x-fleet-backend``), a's gauges after them, and when the metric read 0 again.
  Believed, a's phantom load would send every one of them to b;
- ``restart``: the admin API's restart of a, timed at the supervisor: its drain must end on flat
  counters after ``supervisor.drain_stalled_s`` (30 s by default), as the sleep's did in run 3.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cut_gauges import PORT, launch, more_rows, sample, trial
from cut_sleep import States, admin, up_said
from detached_up import stop
from gpu_fleet import GW, base_fleet, fleet_healthy, inst, wait
from twin_stats import load as load_rows


def start(model_dir: str, w: Path, vllm_args: list[str] | None, vllm_command: list[str] | None) -> dict[str, Any]:
    fleet = {**base_fleet(w), "instances": [
        {**inst(name, model_dir, [0], [f"tiny-{name}", "tiny"], port), "gpu_memory_utilization": 0.4,
         "sleep": {"level": 1, "preload": True}} for name, port in (("a", PORT), ("b", PORT + 1))]}
    if vllm_args is not None:
        for i in fleet["instances"]:
            i["vllm_args"] = list(vllm_args)
    if vllm_command is not None:
        fleet["vllm_command"] = vllm_command
    took = launch(w, fleet, 600)
    return {"up_to_ready_s": round(took, 1), "vllm_args": fleet["instances"][0]["vllm_args"],
            "vllm_command": fleet.get("vllm_command")}


def stalled_metric() -> dict[str, float]:
    """``fleet_backend_load_stalled`` per backend, as the gateway's /metrics reads."""
    text = httpx.get(GW + "/metrics", timeout=5).text
    return {s.labels["backend"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "fleet_backend_load_stalled"}


def until(cond: Any, limit: float, every: float = 0.1) -> float | None:
    """Seconds until ``cond()`` held; None if it did not within ``limit``."""
    t = time.monotonic()
    while time.monotonic() - t < limit:
        if cond():
            return round(time.monotonic() - t, 2)
        time.sleep(every)
    return None


def route(n: int) -> list[list[Any]]:
    """``n`` short completions of ``tiny`` through the gateway, one at a time: [replica, status]."""
    out = []
    for _ in range(n):
        r = httpx.post(GW + "/v1/completions", json={"model": "tiny", "prompt": "hello", "max_tokens": 4}, timeout=60)
        out.append([r.headers.get("x-fleet-backend"), r.status_code])
    return out


def restart(w: Path, every: float) -> dict[str, Any]:
    """The admin API's restart of a: seconds from the ask to the end of its drain and to RUNNING."""
    log_at = (w / "up.log").stat().st_size
    states = States(every)
    out: dict[str, Any] = {"status": admin(w, "restart")}
    states.until("DRAINING", states.t, 10.0)
    out["drained_after_s"] = states.until("DRAINING", states.t, 150.0, leave=True)
    out["running_after_s"] = states.until("RUNNING", states.t, 600.0)
    out["states"] = states.seen
    out["up_said"] = up_said(w, log_at)
    wait(lambda: fleet_healthy(["a"]), 120, "instance a back in rotation")
    return out


def on_stuck(w: Path, step: str, a: argparse.Namespace, cut: float) -> dict[str, Any]:
    """What the gateway and the supervisor do with a's stuck gauges (the module's docstring)."""
    out: dict[str, Any] = {"step": step, "at_ask": sample(cut)}
    out["flagged_after_s"] = until(lambda: bool((sample(cut).get("gateway_load") or {}).get("stalled")), 20.0, 0.5)
    out["metric_flagged"] = stalled_metric()
    if step == "route":
        out["requests"] = route(a.requests)
        out["after_requests"] = sample(cut)
        out["metric_zero_after_s"] = until(lambda: stalled_metric().get("a") == 0.0, 10.0)
    else:
        out["restart"] = restart(w, a.every)
    return out


def summary(row: dict[str, Any]) -> dict[str, Any]:
    s = row["on_stuck"]
    out: dict[str, Any] = {"trial": row["trial"], "step": s["step"], "busy_at_ask": s["at_ask"].get("busy"),
                           "flagged_after_cut_s": row["summary"]["gateway_stalled_at_s"],
                           "metric_flagged": s["metric_flagged"]}
    if s["step"] == "route":
        got = [b for b, _ in s["requests"]]
        out["requests_to"] = {name: got.count(name) for name in ("a", "b")}
        out["statuses"] = sorted({code for _, code in s["requests"]})
        out["busy_after_requests"] = s["after_requests"].get("busy")
        out["metric_zero_after_s"] = s["metric_zero_after_s"]
    else:
        r = s["restart"]
        out.update({"drained_after_s": r["drained_after_s"], "running_after_s": r["running_after_s"],
                    "drain_on_flat_counters": any("drained: vLLM" in line for line in r["up_said"])})
    return out


def report(rows: list[dict[str, Any]]) -> str:
    stuck = [summary(r) for r in rows if "on_stuck" in r]
    lines = [f"{len(rows)} cuts, {len(stuck)} left a's gauges above 0 at the end of the watch.", "",
             "| trial | a's gauges at the ask | the gateway called a stalled, s after the cut | "
             "fleet_backend_load_stalled | step | requests to a / b | a's gauges after | "
             "metric back to 0 after, s | drain ended, s | "
             "RUNNING again, s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for s in stuck:
        to = s.get("requests_to")
        split = f"{to['a']} / {to['b']}" if to else "-"
        lines.append(f"| {s['trial']} | {s['busy_at_ask']:g} | {s['flagged_after_cut_s']} | {s['metric_flagged']} | "
                     f"{s['step']} | {split} | {s.get('busy_after_requests', '-')} | "
                     f"{s.get('metric_zero_after_s', '-')} | {s.get('drained_after_s', '-')}"
                     f"{' (flat counters)' if s.get('drain_on_flat_counters') else ''} | "
                     f"{s.get('running_after_s', '-')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("phase", choices=["start", "run", "stop", "report"])
    ap.add_argument("rows", nargs="*", help="report: rows.json files (.gz too)")
    ap.add_argument("--model-dir", default="/tmp/tiny-model")
    ap.add_argument("--out", default="/tmp/cut-pair")
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--conc", type=int, default=512)
    ap.add_argument("--load-s", type=float, default=10.0)
    ap.add_argument("--watch", type=float, default=8.0)
    ap.add_argument("--every", type=float, default=0.5)
    ap.add_argument("--requests", type=int, default=16, help="run: the route step's requests")
    ap.add_argument("--on-stuck", default="route,restart", help="run: the steps taken in turn after stuck cuts")
    ap.add_argument("--vllm-args", help="start: both instances' vLLM arguments")
    ap.add_argument("--vllm-command", help="start: the fleet file's vllm_command")
    a = ap.parse_args(argv)
    a.files, a.then_sleep = False, None  # cut_gauges.trial's options this script does not use
    if a.phase == "report":
        print(report(load_rows(a.rows)))
        return
    w = Path(a.out)
    w.mkdir(parents=True, exist_ok=True)
    res: Any
    if a.phase == "start":
        res = start(a.model_dir, w, a.vllm_args.split() if a.vllm_args else None,
                    a.vllm_command.split() if a.vllm_command else None)
    elif a.phase == "run":
        steps = a.on_stuck.split(",")
        if set(steps) - {"route", "restart"}:
            ap.error(f"--on-stuck: each of route, restart, not {a.on_stuck!r}")
        def one(n: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
            step = steps[sum("on_stuck" in r for r in rows) % len(steps)]  # in turn over every stuck cut so far
            return trial(a.model_dir, w, "d", n, a, functools.partial(on_stuck, w, step, a))
        res = more_rows(w, a.trials, one)
        print(report(res))
    else:
        res = stop(w)
    (w / f"{a.phase}.json").write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
