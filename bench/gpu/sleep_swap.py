"""More models than GPUs on one real GPU (issue 15): three random-weight Llamas share GPU 0 through
vLLM's sleep mode (level 1) behind the gateway; two fit awake at once.

    python3 bench/gpu/sleep_swap.py start   --out OUT   # make the models, `vllm-fleet up` (setsid), wait ready
    python3 bench/gpu/sleep_swap.py measure --out OUT   # wakes with room, wakes with a swap, mixed load, stop

``start`` returns once the fleet is up, leaving it running for ``measure`` (the device machine keeps
processes started with setsid between calls while it is warm). Every figure is measured through
the gateway with a streamed request: time from sending it to the first content token.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

GW = "http://127.0.0.1:8080"
SUP = "http://127.0.0.1:9400"
STATE = Path("/tmp/fleet-state")
MODELS = {  # name -> (layers, GB of bf16 weights, roughly): hidden 3072, 24 heads, 8 KV heads, MLP 8192
    "s": 14, "m": 28, "l": 56,
}
UTIL = 0.4  # three instances x 0.4 > 1.0: at most two awake on the GPU


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def admin_key() -> str:
    return (STATE / "admin.key").read_text().strip()


def states() -> dict[str, str]:
    try:
        return {i["name"]: i["state"] for i in httpx.get(SUP + "/instances", timeout=2).json()["instances"]}
    except (httpx.HTTPError, ValueError, KeyError):
        return {}


def wait(cond: Any, timeout: float, what: str) -> float:
    t = time.monotonic()
    while not cond():
        if time.monotonic() - t > timeout:
            raise TimeoutError(f"{what} (states {states()})")
        time.sleep(0.05)
    return time.monotonic() - t


def weights_gb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.glob("*.safetensors")) / 1e9


def start(out: Path) -> dict[str, Any]:
    res: dict[str, Any] = {"models": {}}
    for name, layers in MODELS.items():
        d = Path(f"/tmp/model-{name}")
        t = time.monotonic()
        subprocess.run([sys.executable, "-m", "vllm_fleet.cli", "make-tiny-model", str(d), "--hidden", "3072",
                        "--layers", str(layers), "--heads", "24", "--kv-heads", "8", "--intermediate", "8192",
                        "--dtype", "bfloat16", "--device", "cuda"], check=True, capture_output=True)
        res["models"][name] = {"layers": layers, "weights_gb": round(weights_gb(d), 2),
                               "made_s": round(time.monotonic() - t, 1)}
        log(f"model {name}: {res['models'][name]}")
    env = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    fleet = {
        "gateway": {"host": "127.0.0.1", "port": 8080},
        "supervisor": {"startup_timeout_s": 400, "health_interval_s": 1, "stop_grace_s": 30,
                       "log_dir": str(out / "logs"), "state_dir": str(STATE), "metrics_port": 9400,
                       "progress_interval_s": 15},
        "swap": {"hold_s": 2},
        "instances": [{"name": n, "model": f"/tmp/model-{n}", "served_model_names": [f"model-{n}"], "gpus": [0],
                       "port": 8001 + i, "gpu_memory_utilization": UTIL, "env": env,
                       "vllm_args": ["--enforce-eager", "--max-model-len", "2048"],
                       # Explicit level 1: this VM's MemAvailable starts small and grows with use.
                       "sleep": {"level": 1, "preload": n == "m"}} for i, n in enumerate(MODELS)],
    }
    path = out / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet))
    res["check"] = subprocess.run([sys.executable, "-m", "vllm_fleet.cli", "check", "-c", str(path)],
                                  capture_output=True, text=True).stdout
    fh = open(out / "up.log", "wb")  # noqa: SIM115 - the fleet outlives this call
    subprocess.Popen([sys.executable, "-m", "vllm_fleet.cli", "up", "-c", str(path)], stdout=fh,
                     stderr=subprocess.STDOUT, start_new_session=True)
    want = {"s": "SLEEPING", "m": "RUNNING", "l": "SLEEPING", "gateway": "RUNNING"}
    res["up_to_ready_s"] = round(wait(lambda: states() == want, 480, "fleet ready"), 1)
    wait(lambda: _ready(), 60, "gateway ready")
    res["cold_start_s"] = cold_starts(out / "up.log")
    log(f"ready in {res['up_to_ready_s']}s; cold starts {res['cold_start_s']}")
    return res


def _ready() -> bool:
    try:
        return httpx.get(GW + "/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def cold_starts(up_log: Path) -> dict[str, float]:
    """STARTING -> RUNNING per instance, from `up`'s own lines."""
    found: dict[str, float] = {}
    for m in re.finditer(r"\[fleet\] (\w+): STARTING -> RUNNING after ([0-9.]+)s", up_log.read_text(errors="replace")):
        found.setdefault(m.group(1), float(m.group(2)))
    return found


def first_token(model: str, max_tokens: int = 16) -> tuple[float | None, str | None]:
    """Seconds from sending a streamed chat to its first content chunk, through the gateway."""
    body = {"model": model, "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": "hello there"}]}
    t = time.monotonic()
    ttft = None
    try:
        with httpx.stream("POST", GW + "/v1/chat/completions", json=body, timeout=120) as r:
            if r.status_code != 200:
                return None, f"HTTP {r.status_code}: {r.read()[:200]!r}"
            done = False
            for line in r.iter_lines():
                if ttft is None and line.startswith("data: {") and '"content"' in line:
                    ttft = time.monotonic() - t
                if line.startswith("data: [DONE]"):
                    done = True
                if line.startswith("data: {\"error\""):
                    return None, line[:200]
            if not done:
                return None, "stream ended without [DONE]"
    except httpx.HTTPError as e:
        return None, repr(e)
    return ttft, None


def admin(name: str, action: str) -> None:
    r = httpx.post(f"{GW}/admin/instances/{name}/{action}", headers={"Authorization": f"Bearer {admin_key()}"},
                   timeout=30)
    r.raise_for_status()


def asleep(*names: str) -> None:
    for n in names:
        if states().get(n) == "RUNNING":
            admin(n, "sleep")
    wait(lambda: all(states().get(n) == "SLEEPING" for n in names), 120, f"{names} asleep")


def wake_times(up_log: Path) -> list[tuple[str, float]]:
    """vLLM's own figure for each wake ("It took X seconds to wake up"), per instance."""
    return [(m.group(1), float(m.group(2))) for m in
            re.finditer(r"\[(\w+)\] \(EngineCore[^)]*\).*It took ([0-9.]+) seconds to wake up",
                        up_log.read_text(errors="replace"))]


def measure(out: Path, mixed_s: float, rate: float) -> dict[str, Any]:
    res: dict[str, Any] = {}
    models = json.loads((out / "start.json").read_text())["models"] if (out / "start.json").exists() else {}
    # Warm each instance once (the first sleep of each copies its weights out: 2.5 s for 5.6 GB).
    for n in MODELS:
        first_token(f"model-{n}")
    # (a) Wake with room: the others asleep, so nothing needs to sleep first.
    room: dict[str, list[float]] = {n: [] for n in MODELS}
    for _ in range(3):
        for n in MODELS:
            asleep(*MODELS)
            time.sleep(1.5)
            ttft, err = first_token(f"model-{n}")
            if ttft is None:
                raise RuntimeError(f"wake with room, {n}: {err}")
            room[n].append(round(ttft, 3))
    res["wake_with_room_ttft_s"] = room
    log(f"wake with room: {room}")
    # (b) Wake that needs a swap: two awake and idle, the third asked for.
    swap: list[dict[str, Any]] = []
    order = ["s", "m", "l"]
    for i in range(9):
        target = order[i % 3]
        others = [o for o in order if o != target]
        asleep(target)
        for o in others:
            if states().get(o) != "RUNNING":
                first_token(f"model-{o}")  # wakes it (with room: the target sleeps)
        wait(lambda others=others: all(states().get(o) == "RUNNING" for o in others), 120, "two awake")
        time.sleep(1.5)  # idle past the policy's quiet time
        ttft, err = first_token(f"model-{target}")
        if ttft is None:
            raise RuntimeError(f"wake with swap, {target}: {err}")
        swap.append({"model": target, "ttft_s": round(ttft, 3), "states_after": states()})
    res["wake_with_swap"] = swap
    vals = [x["ttft_s"] for x in swap]
    res["wake_with_swap_ttft_p50_s"] = round(statistics.median(vals), 3)
    res["wake_with_swap_ttft_max_s"] = round(max(vals), 3)
    log(f"wake with swap: p50 {res['wake_with_swap_ttft_p50_s']} max {res['wake_with_swap_ttft_max_s']}")
    res["wake_s_from_log"] = wake_times(out / "up.log")
    res["mixed"] = mixed(mixed_s, rate)
    res["supervisor_metrics"] = [ln for ln in httpx.get(SUP + "/metrics").text.splitlines()
                                 if ln.startswith(("fleet_swaps_total", "fleet_wake_seconds_sum",
                                                   "fleet_wake_seconds_count"))]
    res["models"] = models
    return res


def mixed(seconds: float, rate: float) -> dict[str, Any]:
    """Poisson arrivals (``rate`` per second) over the three models, weights 3:2:1, streamed."""
    rng = random.Random(7)
    results: list[dict[str, Any]] = []
    threads: list[threading.Thread] = []
    lock = threading.Lock()

    def one(model: str) -> None:
        t0 = time.time()
        ttft, err = first_token(model, max_tokens=64)
        with lock:
            results.append({"model": model, "ttft_s": ttft, "error": err, "at": t0})

    swaps0 = swap_count()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        model = rng.choices(["model-m", "model-s", "model-l"], weights=[3, 2, 1])[0]
        t = threading.Thread(target=one, args=(model,))
        t.start()
        threads.append(t)
        time.sleep(rng.expovariate(rate))
    for t in threads:
        t.join(300)
    ok = [r["ttft_s"] for r in results if r["error"] is None]
    failed = [r for r in results if r["error"] is not None]
    qs = statistics.quantiles(ok, n=100) if len(ok) > 2 else [0.0] * 99
    res = {"seconds": seconds, "rate_per_s": rate, "requests": len(results), "failed": len(failed),
           "failures": failed[:10], "ttft_p50_s": round(statistics.median(ok), 3) if ok else None,
           "ttft_p99_s": round(qs[98], 3), "ttft_max_s": round(max(ok), 3) if ok else None,
           "swaps": swap_count() - swaps0,
           "per_model": {m: {"n": len(v), "ttft_p50_s": round(statistics.median(v), 3)}
                         for m in ("model-s", "model-m", "model-l")
                         if (v := [r["ttft_s"] for r in results if r["model"] == m and r["error"] is None])}}
    log(f"mixed: {res}")
    return res


def swap_count() -> float:
    text = httpx.get(SUP + "/metrics").text
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith("fleet_swaps_total{"))


def stop(out: Path) -> dict[str, Any]:
    pids = subprocess.run(["pgrep", "-f", "vllm_fleet.cli up"], capture_output=True, text=True).stdout.split()
    for p in pids:
        os.kill(int(p), signal.SIGTERM)
    t = time.monotonic()
    while subprocess.run(["pgrep", "-f", "vllm_fleet.cli up"], capture_output=True).returncode == 0:
        if time.monotonic() - t > 90:
            break
        time.sleep(0.5)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip()
    return {"stop_s": round(time.monotonic() - t, 1), "gpu_used_after": smi}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("phase", choices=["start", "measure"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--mixed-s", type=float, default=300.0)
    ap.add_argument("--rate", type=float, default=1.0)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.phase == "start":
        res = start(out)
        (out / "start.json").write_text(json.dumps(res, indent=1))
    else:
        try:
            res = measure(out, a.mixed_s, a.rate)
        finally:
            res_stop = stop(out)
        res["stop"] = res_stop
        (out / "measure.json").write_text(json.dumps(res, indent=1, default=str))
    print(json.dumps(res, indent=1, default=str)[-5000:])


if __name__ == "__main__":
    main()
