"""Issue 19 on 2 x H200: one vLLM instance over a Ray cluster, behind the gateway (bench/gpu/ray_run.sh).

    python3 bench/gpu/ray_measure.py fleet --backend ray --tp 1 --pp 2 --gpus 0 --out F.yaml
    python3 bench/gpu/ray_measure.py wait --name tiny --log LOG --timeout 400     # RUNNING, or the error
    python3 bench/gpu/ray_measure.py chat --model tiny                            # stream and not
    python3 bench/gpu/ray_measure.py load --model tiny --conc 64 --tokens 128     # tokens/s through the gateway
    python3 bench/gpu/ray_measure.py kill-api --name tiny --model tiny            # SIGKILL the API server
    python3 bench/gpu/ray_measure.py kill-raylet --name tiny --model tiny --node-ip 127.0.0.2 --rejoin CMD

Each prints one JSON object (and --json FILE writes it). Timelines sample the supervisor's
/instances, NVML (memory and compute processes per GPU) and the ``ray::`` processes every 0.25 s.
Only the standard library, aiohttp and nvidia-ml-py, which the GPU machine has.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

GW = "http://127.0.0.1:8080"
SUP = "http://127.0.0.1:9400"
T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} +{time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def get_json(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def instances() -> dict[str, dict[str, Any]]:
    try:
        return {i["name"]: i for i in get_json(SUP + "/instances")["instances"]}
    except (OSError, ValueError, KeyError):
        return {}


def gw_ready() -> bool:
    try:
        with urllib.request.urlopen(GW + "/ready", timeout=2) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.HTTPError):
        return False


# -- what runs where ----------------------------------------------------------------------------

_nvml: Any = None


def gpus() -> list[dict[str, Any]]:
    """Per GPU: memory used (MiB) and the compute processes with their MiB."""
    global _nvml
    if _nvml is None:
        import pynvml
        pynvml.nvmlInit()
        _nvml = pynvml
    out = []
    for i in range(_nvml.nvmlDeviceGetCount()):
        h = _nvml.nvmlDeviceGetHandleByIndex(i)
        used = _nvml.nvmlDeviceGetMemoryInfo(h).used // (1 << 20)
        procs = [[p.pid, (p.usedGpuMemory or 0) // (1 << 20)] for p in _nvml.nvmlDeviceGetComputeRunningProcesses(h)]
        out.append({"gpu": i, "used_mib": int(used), "procs": procs})
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def ray_procs() -> list[tuple[int, str]]:
    """Processes whose title is ray::… (actors and idle workers) and the raylets."""
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            c = cmdline(int(d))
            if c.startswith("ray::") or "/raylet " in c or c.endswith("/raylet"):
                found.append((int(d), c[:160]))
    return found


def who(pid: int) -> dict[str, Any]:
    return {"pid": pid, "cmd": cmdline(pid)[:120], "ppid": ppid(pid), "parent": cmdline(ppid(pid))[:80]}


def ray_kinds() -> dict[str, int]:
    """How many ``ray::`` processes of each title (``ray::IDLE``, ``ray::RayWorkerProc``…)."""
    out: dict[str, int] = {}
    for _, c in ray_procs():
        if c.startswith("ray::"):
            k = c.split(" ")[0][:60]
            out[k] = out.get(k, 0) + 1
    return out


def nvidia_smi() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv"],
                              capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"nvidia-smi failed: {e}"


# -- fleet file -----------------------------------------------------------------------------------

def fleet(args: argparse.Namespace) -> dict[str, Any]:
    import yaml
    env = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
           "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    inst: dict[str, Any] = {
        "name": args.name, "model": args.model_dir, "served_model_names": [args.served],
        "gpus": [int(g) for g in args.gpus.split(",")], "tensor_parallel_size": args.tp,
        "pipeline_parallel_size": args.pp, "port": 8001, "gpu_memory_utilization": args.gmu,
        "vllm_args": ["--enforce-eager", "--max-model-len", "2048", *args.extra.split()], "env": env}
    for kv in args.env:
        key, _, value = kv.partition("=")
        env[key] = value
    if args.backend == "ray":
        inst["distributed_executor_backend"] = "ray"
        env["VLLM_HOST_IP"] = "127.0.0.1"  # the head raylet's --node-ip-address
    elif args.backend == "mp":
        inst["distributed_executor_backend"] = "mp"
    doc = {
        "gateway": {"host": "127.0.0.1", "port": 8080},
        "supervisor": {"startup_timeout_s": args.startup_timeout, "health_interval_s": 1, "stop_grace_s": 30,
                       "log_dir": args.log_dir, "state_dir": args.state_dir, "metrics_port": 9400,
                       "progress_interval_s": 15, "start_retries": 3, "backoff_max_s": 10},
        "instances": [inst],
    }
    Path(args.out).write_text(yaml.safe_dump(doc, sort_keys=False))
    return doc


# -- waiting ------------------------------------------------------------------------------------

def error_lines(path: str, n: int = 80) -> dict[str, Any]:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as e:
        return {"log": f"unreadable: {e}"}
    lines = text.splitlines()
    errs = [ln for ln in lines if re.search(r"\b\w*(Error|Exception)\b[:(]", ln)]
    return {"errors": errs[-15:], "tail": lines[-n:]}


def wait(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.monotonic()
    seen: list[tuple[float, str | None, str | None]] = []
    last: tuple[str | None, str | None] = (None, None)
    while True:
        snap = instances()
        s = snap.get(args.name, {}).get("state")
        g = snap.get("gateway", {}).get("state")
        if (s, g) != last:
            last = (s, g)
            seen.append((round(time.monotonic() - t0, 1), s, g))
            log(f"{args.name}: {s}, gateway: {g}")
        if s == "RUNNING" and g == "RUNNING" and gw_ready():
            return {"ok": True, "ready_s": round(time.monotonic() - t0, 1), "states": seen,
                    "pid": snap[args.name].get("pid")}
        if s in ("EXITED", "BACKOFF", "FATAL") or (args.fail_on_stop and s == "STOPPED" and len(seen) > 1):
            time.sleep(2)  # let the last lines reach the log
            return {"ok": False, "state": s, "after_s": round(time.monotonic() - t0, 1), "states": seen,
                    **error_lines(args.log)}
        if time.monotonic() - t0 > args.timeout:
            return {"ok": False, "state": s, "after_s": round(time.monotonic() - t0, 1), "states": seen,
                    "why": "timeout", **error_lines(args.log)}
        time.sleep(0.5)


# -- requests -----------------------------------------------------------------------------------

def chat_once(model: str, stream: bool, max_tokens: int = 24, timeout: float = 60) -> dict[str, Any]:
    body = {"model": model, "stream": stream, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "Say hello to the Ray cluster."}]}
    req = urllib.request.Request(GW + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    t = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            if not stream:
                obj = json.loads(r.read())
                return {"ok": True, "status": r.status, "s": round(time.monotonic() - t, 3),
                        "text": obj["choices"][0]["message"]["content"][:120], "usage": obj.get("usage"),
                        "finish": obj["choices"][0].get("finish_reason")}
            chunks, text, done, first = 0, "", False, None
            for raw in r:
                line = raw.decode(errors="replace").strip()
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: {"):
                    delta = json.loads(line[6:])["choices"][0].get("delta", {}).get("content") or ""
                    if delta:
                        first = first or time.monotonic() - t
                        chunks += 1
                        text += delta
            return {"ok": done, "status": r.status, "s": round(time.monotonic() - t, 3),
                    "ttft_s": round(first, 3) if first else None, "content_chunks": chunks, "text": text[:120]}
    except urllib.error.HTTPError as e:
        return {"ok": False, "status": e.code, "body": e.read()[:300].decode(errors="replace")}
    except (OSError, ValueError, KeyError, IndexError) as e:
        return {"ok": False, "error": repr(e)[:300]}


def chat(args: argparse.Namespace) -> dict[str, Any]:
    return {"non_stream": chat_once(args.model, False), "stream": chat_once(args.model, True)}


async def _load_pass(model: str, conc: int, tokens: int, total: int) -> dict[str, Any]:
    import aiohttp
    body = {"model": model, "stream": True, "max_tokens": tokens, "ignore_eos": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "Count the nodes of a Ray cluster."}]}
    ttfts: list[float] = []
    toks: list[int] = []
    errors: list[str] = []
    sem = asyncio.Semaphore(conc)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conc), timeout=timeout) as session:
        async def one() -> None:
            async with sem:
                t = time.perf_counter()
                first = None
                chunks = 0
                usage = None
                try:
                    async with session.post(GW + "/v1/chat/completions", json=body) as r:
                        if r.status != 200:
                            errors.append(f"HTTP {r.status}: {(await r.text())[:200]}")
                            return
                        async for raw in r.content:
                            if not raw.startswith(b"data: {"):
                                continue
                            obj = json.loads(raw[6:])
                            if obj.get("usage"):
                                usage = obj["usage"].get("completion_tokens")
                            ch = obj.get("choices") or []
                            if ch and ch[0].get("delta", {}).get("content"):
                                first = first or time.perf_counter() - t
                                chunks += 1
                except (TimeoutError, aiohttp.ClientError, ValueError) as e:
                    errors.append(repr(e)[:200])
                    return
                if first is not None:
                    ttfts.append(first)
                toks.append(usage if usage is not None else chunks)

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(total)))
        wall = time.perf_counter() - t0
    ttfts.sort()
    return {"requests": total, "ok": len(toks), "errors": len(errors), "error_sample": errors[:3],
            "tokens": sum(toks), "wall_s": round(wall, 3), "tokens_per_s": round(sum(toks) / wall, 1),
            "ttft_p50_s": round(statistics.median(ttfts), 4) if ttfts else None,
            "ttft_p90_s": round(ttfts[int(0.9 * (len(ttfts) - 1))], 4) if ttfts else None}


def load(args: argparse.Namespace) -> dict[str, Any]:
    total = args.conc * args.waves
    warm = asyncio.run(_load_pass(args.model, args.conc, args.tokens, args.conc))
    passes = []
    for i in range(args.passes):
        p = asyncio.run(_load_pass(args.model, args.conc, args.tokens, total))
        log(f"pass {i}: {p['tokens_per_s']} tokens/s, ttft p50 {p['ttft_p50_s']} s, errors {p['errors']}")
        passes.append(p)
    return {"model": args.model, "conc": args.conc, "max_tokens": args.tokens, "requests_per_pass": total,
            "warmup": warm, "passes": passes,
            "tokens_per_s_median": statistics.median(p["tokens_per_s"] for p in passes),
            "ttft_p50_median_s": statistics.median(p["ttft_p50_s"] or 0 for p in passes)}


# -- faults -------------------------------------------------------------------------------------

def _gpu_pids(sample: list[dict[str, Any]]) -> set[int]:
    return {p for g in sample for p, _ in g["procs"]}


def follow(name: str, model: str, old_pid: int | None, old_gpu_pids: set[int], timeout: float,
           then: tuple[float, str] | None = None, smi_at: tuple[float, ...] = (1, 3, 6, 10, 20, 40),
           observe: float = 0.0, probe_every: float = 0.0) -> dict[str, Any]:
    """Sample until the instance serves again with a new pid (a chat through the gateway answers),
    and for at least ``observe`` seconds in all."""
    t0 = time.monotonic()
    events: dict[str, float] = {}
    states: list[tuple[float, str | None, int | None, str | None]] = []
    timeline: list[dict[str, Any]] = []
    smi: dict[str, str] = {}
    last: tuple[str | None, int | None] = (None, None)
    pending_smi = list(smi_at)
    rejoin_out: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    probes: list[dict[str, Any]] = []
    next_probe = 0.0
    # Probes run in a thread, so that a probe waiting for its timeout does not stop the sampling.
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    pending: tuple[float, concurrent.futures.Future[dict[str, Any]]] | None = None
    while True:
        t = round(time.monotonic() - t0, 2)
        snap = instances().get(name, {})
        s, pid = snap.get("state"), snap.get("pid")
        if (s, pid) != last:
            last = (s, pid)
            states.append((t, s, pid, snap.get("last_exit")))
            log(f"{name}: {s} pid {pid} ({snap.get('last_exit')})")
        sample = gpus()
        now = _gpu_pids(sample)
        rp = ray_procs()
        workers = [p for p, c in rp if c.startswith("ray::RayWorkerProc")]
        timeline.append({"t": t, "state": s, "pid": pid, "gpu_mib": [g["used_mib"] for g in sample],
                         "gpu_procs": [p for g in sample for p in g["procs"]], "ray_worker_procs": len(workers),
                         "ray": ray_kinds()})
        if old_pid is not None and "api_server_gone" not in events and not Path(f"/proc/{old_pid}").exists():
            events["api_server_gone"] = t
        if "old_gpu_procs_gone" not in events and old_gpu_pids and not (old_gpu_pids & now):
            events["old_gpu_procs_gone"] = t
            log(f"the old GPU processes {sorted(old_gpu_pids)} are gone")
        if "gpus_empty" not in events and not now:
            events["gpus_empty"] = t
        if pending_smi and t >= pending_smi[0]:
            smi[f"+{pending_smi.pop(0)}s"] = nvidia_smi()
        if then is not None and rejoin_out is None and t >= then[0]:
            events["rejoin_started"] = t
            smi["before_rejoin"] = nvidia_smi()
            st = subprocess.run(["python3", "-m", "ray.scripts.scripts", "status", "--address", "127.0.0.1:6379"],
                                capture_output=True, text=True, timeout=60)
            log("rejoining: " + then[1])
            r = subprocess.run(then[1], shell=True, capture_output=True, text=True, timeout=120)
            events["rejoin_returned"] = round(time.monotonic() - t0, 2)
            rejoin_out = {"ray_status_before": st.stdout + st.stderr, "rc": r.returncode,
                          "out": (r.stdout + r.stderr)[-3000:]}
        if s == "RUNNING" and pid is not None and pid != old_pid and "running" not in events:
            events["running"] = t
        if pending is not None and pending[1].done():
            c = pending[1].result()
            probes.append({"t": pending[0], "ok": c["ok"], "status": c.get("status"),
                           "err": (c.get("body") or c.get("error") or "")[:160]})
            if c["ok"] and "probe_ok_again" not in events and len(probes) > 1 and not probes[-2]["ok"]:
                events["probe_ok_again"] = pending[0]
            pending = None
        if probe_every and result is None and pending is None and t >= next_probe:
            # What a client sees meanwhile: one short chat through the gateway.
            pending = (t, pool.submit(chat_once, model, False, 4, 3))
            next_probe = t + probe_every
        if "running" in events and result is None:
            c = chat_once(model, False, timeout=30)
            if c["ok"]:
                events["chat_ok"] = round(time.monotonic() - t0, 2)
                smi["after_restart"] = nvidia_smi()
                result = {"ok": True, "new_pid": pid, "chat": c}
                log(f"serving again: RUNNING at +{events['running']}s, chat answered at +{events['chat_ok']}s")
        if result is None and time.monotonic() - t0 > timeout:
            result = {"ok": False, "why": "timeout"}
        if result is not None and time.monotonic() - t0 >= observe:
            end = gpus()
            # Who holds GPU memory at the end, and are they the new instance's or leftovers?
            result["gpu_procs_end"] = [{**who(p), "mib": m, "old": p in old_gpu_pids}
                                       for g in end for p, m in g["procs"]]
            result["orphans_end"] = [p for p in result["gpu_procs_end"] if p["old"]]
            result["ray_procs_end"] = ray_procs()
            smi["end"] = nvidia_smi()
            pool.shutdown(wait=False)
            return {**result, "events": events, "states": states, "nvidia_smi": smi, "probes": probes,
                    "rejoin": rejoin_out, "sampled_s": round(time.monotonic() - t0, 2), "timeline": timeline}
        time.sleep(0.25)


def running_pid(name: str) -> int | str:
    """The API server's pid of a RUNNING instance, or why there is none (the faults need one)."""
    snap = instances().get(name, {})
    if snap.get("state") != "RUNNING" or not snap.get("pid"):
        return f"{name} is not RUNNING: {snap}"
    return int(snap["pid"])


def kill_api(args: argparse.Namespace) -> dict[str, Any]:
    pid = running_pid(args.name)
    if isinstance(pid, str):
        return {"ok": False, "why": pid}
    before = gpus()
    old = _gpu_pids(before)
    info = {"api_server": who(pid), "gpu_before": before, "gpu_procs_before": [who(p) for p in sorted(old)],
            "nvidia_smi_before": nvidia_smi(), "ray_procs_before": ray_procs(), "ray_kinds_before": ray_kinds()}
    log(f"SIGKILL API server {pid}; GPU processes {sorted(old)}")
    os.kill(pid, signal.SIGKILL)
    res = follow(args.name, args.model, pid, old, args.timeout, observe=args.observe)
    return {**info, **res}


def kill_actor(args: argparse.Namespace) -> dict[str, Any]:
    """SIGKILL the Ray actor that holds the GPU (ray::RayWorkerProc…): the GPU worker dies, the
    API server and its EngineCore (the Ray driver) live on. Does the supervisor notice?"""
    pid = running_pid(args.name)
    if isinstance(pid, str):
        return {"ok": False, "why": pid}
    before = gpus()
    old = _gpu_pids(before)
    actors = [p for p in sorted(old) if cmdline(p).startswith("ray::")]
    if not actors:
        return {"ok": False, "why": "no ray:: process holds a GPU", "gpu_procs": [who(p) for p in old]}
    info = {"api_server": who(pid), "actor": who(actors[0]), "gpu_before": before,
            "gpu_procs_before": [who(p) for p in sorted(old)], "ray_kinds_before": ray_kinds()}
    log(f"SIGKILL Ray actor {actors[0]} ({cmdline(actors[0])[:40]}); API server {pid}")
    os.kill(actors[0], signal.SIGKILL)
    res = follow(args.name, args.model, pid, old, args.timeout, observe=args.observe, probe_every=args.probe)
    return {**info, **res}


def kill_group(args: argparse.Namespace) -> dict[str, Any]:
    """SIGKILL the API server's whole process group at once (its EngineCore, the Ray driver,
    included), as the OOM killer or `kill -9 -PGID` would: nothing gets to shut down."""
    pid = running_pid(args.name)
    if isinstance(pid, str):
        return {"ok": False, "why": pid}
    pgid = os.getpgid(pid)
    members = [int(d) for d in os.listdir("/proc") if d.isdigit() and _pgid(int(d)) == pgid]
    before = gpus()
    old = _gpu_pids(before)
    info = {"api_server": who(pid), "group": [who(m) for m in members], "gpu_before": before,
            "gpu_procs_before": [who(p) for p in sorted(old)], "ray_kinds_before": ray_kinds()}
    log(f"SIGKILL process group {pgid} ({len(members)} processes); GPU processes {sorted(old)}")
    os.killpg(pgid, signal.SIGKILL)
    res = follow(args.name, args.model, pid, old, args.timeout, observe=args.observe, probe_every=args.probe)
    return {**info, **res}


def _pgid(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except OSError:
        return -1


def kill_raylet(args: argparse.Namespace) -> dict[str, Any]:
    pid = running_pid(args.name)
    if isinstance(pid, str):
        return {"ok": False, "why": pid}
    before = gpus()
    old = _gpu_pids(before)
    # --node-ip "" takes any raylet (one node on one host)
    raylets = [(p, c) for p, c in ray_procs() if "raylet" in c.split(" ")[0] and f"={args.node_ip}" in c]
    if not raylets:
        return {"ok": False, "why": f"no raylet with {args.node_ip}", "ray_procs": ray_procs()}
    rpid = raylets[0][0]
    info = {"api_server": who(pid), "raylet": who(rpid), "gpu_before": before,
            "gpu_procs_before": [who(p) for p in sorted(old)], "ray_procs_before": ray_procs()}
    log(f"SIGKILL raylet {rpid} ({args.node_ip}); API server {pid}; GPU processes {sorted(old)}")
    os.kill(rpid, signal.SIGKILL)
    res = follow(args.name, args.model, pid, old, args.timeout, then=(args.observe, args.rejoin),
                 observe=args.min_s, probe_every=args.probe)
    return {**info, **res}


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fleet")
    f.add_argument("--backend", choices=["ray", "mp", "none"], required=True,
                   help="none: no distributed_executor_backend in the file (vLLM's default, mp on one node)")
    f.add_argument("--tp", type=int, required=True)
    f.add_argument("--pp", type=int, required=True)
    f.add_argument("--gpus", required=True)
    f.add_argument("--name", default="tiny")
    f.add_argument("--served", default="tiny")
    f.add_argument("--model-dir", default="/tmp/tiny-model")
    f.add_argument("--log-dir", required=True)
    f.add_argument("--state-dir", required=True)
    f.add_argument("--startup-timeout", type=float, default=420)
    f.add_argument("--out", required=True)
    f.add_argument("--gmu", type=float, default=0.25, help="gpu_memory_utilization")
    f.add_argument("--extra", default="", help="more vLLM arguments, one string: --extra=--disable-custom-all-reduce")
    f.add_argument("--env", action="append", default=[], help="KEY=VALUE for the instance's env (repeatable)")
    w = sub.add_parser("wait")
    w.add_argument("--name", default="tiny")
    w.add_argument("--log", required=True)
    w.add_argument("--timeout", type=float, default=400)
    w.add_argument("--fail-on-stop", action="store_true")
    c = sub.add_parser("chat")
    c.add_argument("--model", default="tiny")
    ld = sub.add_parser("load")
    ld.add_argument("--model", default="tiny")
    ld.add_argument("--conc", type=int, default=64)
    ld.add_argument("--tokens", type=int, default=128)
    ld.add_argument("--waves", type=int, default=4)
    ld.add_argument("--passes", type=int, default=3)
    k = sub.add_parser("kill-api")
    k.add_argument("--name", default="tiny")
    k.add_argument("--model", default="tiny")
    k.add_argument("--timeout", type=float, default=300)
    k.add_argument("--observe", type=float, default=0.0, help="sample at least this long, serving or not")
    r = sub.add_parser("kill-raylet")
    r.add_argument("--name", default="tiny")
    r.add_argument("--model", default="tiny")
    r.add_argument("--node-ip", default="127.0.0.2")
    r.add_argument("--observe", type=float, default=40)
    r.add_argument("--rejoin", required=True)
    r.add_argument("--timeout", type=float, default=300)
    r.add_argument("--min-s", type=float, default=0.0, help="sample at least this long")
    ka = sub.add_parser("kill-actor")
    kg = sub.add_parser("kill-group")
    for q in (ka, kg):
        q.add_argument("--name", default="tiny")
        q.add_argument("--model", default="tiny")
        q.add_argument("--timeout", type=float, default=300)
        q.add_argument("--observe", type=float, default=0.0)
    for q in (k, r, ka, kg):
        q.add_argument("--probe", type=float, default=0.0, help="a short chat through the gateway every N s")
    for p in (f, w, c, ld, k, r, ka, kg):
        p.add_argument("--json", default="")
    args = ap.parse_args()
    fn = {"fleet": fleet, "wait": wait, "chat": chat, "load": load, "kill-api": kill_api,
          "kill-raylet": kill_raylet, "kill-actor": kill_actor, "kill-group": kill_group}[args.cmd]
    out = fn(args)
    text = json.dumps(out, indent=1, default=str)
    if args.json:
        Path(args.json).write_text(text)
    summary = {k: v for k, v in out.items() if k not in ("timeline", "tail", "gpu_before", "ray_procs_before")} \
        if isinstance(out, dict) else out
    print(json.dumps(summary, default=str)[:6000], flush=True)
    return 0 if not isinstance(out, dict) or out.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
