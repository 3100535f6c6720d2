"""The fleet on real GPUs with real vLLM (issue: runs on 2×H200 through ../shared/gpu-vllm/).

    python3 bench/gpu/gpu_fleet.py pair --model-dir DIR --out OUT   # 2 one-GPU instances, checks, bench
    python3 bench/gpu/gpu_fleet.py tp   --model-dir DIR --out OUT   # 1 instance, tensor parallel over 2 GPUs

``pair``: ``vllm-fleet up`` with instance a on GPU 0 (served as tiny-a and tiny) and b on GPU 1
(tiny-b and tiny), so ``tiny`` has two replicas. It checks each instance's processes sit on its
own GPU only (NVML compute processes by process group), chats through the gateway with the
openai SDK, runs ``vllm bench serve`` direct to b, through the gateway to b, and through the
gateway to both replicas, SIGKILLs a's API server and times reaping → GPU memory free →
restart → serving, then SIGTERMs ``up`` and checks nothing is left. Writes OUT/summary-*.json.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import bench_clients
import httpx
import openai
import pynvml
import yaml

GW = "http://127.0.0.1:8080"
SUP = "http://127.0.0.1:9400"
VLLM_ARGS = ["--enforce-eager", "--max-model-len", "2048"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def gpu_apps() -> dict[int, list[tuple[int, int]]]:
    """GPU index -> [(pid, used MiB)] of compute processes, straight from NVML (fast to poll)."""
    out: dict[int, list[tuple[int, int]]] = {}
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        out[i] = [(p.pid, (p.usedGpuMemory or 0) >> 20) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
    return out


def gpu_used_mib() -> list[int]:
    return [pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used >> 20
            for i in range(pynvml.nvmlDeviceGetCount())]


def pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def group(pg: int) -> list[int]:
    """Live (non-zombie) members of a process group, from /proc."""
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[2]) == pg and stat[0] != "Z":
                found.append(int(d))
    return found


def instances() -> dict[str, dict[str, Any]]:
    try:
        return {i["name"]: i for i in httpx.get(SUP + "/instances", timeout=2).json()["instances"]}
    except (httpx.HTTPError, ValueError):
        return {}


def fleet_healthy(names: list[str]) -> bool:
    try:
        fleet = httpx.get(GW + "/fleet", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return False
    return all(b["healthy"] for b in fleet["backends"] if b["name"] in names)


def wait(cond: Any, timeout: float, what: str) -> float:
    t = time.monotonic()
    while not cond():
        if time.monotonic() - t > timeout:
            raise TimeoutError(what)
        time.sleep(0.2)
    return time.monotonic() - t


def start_up(fleet: dict[str, Any], out: Path, tag: str) -> subprocess.Popen[bytes]:
    path = out / f"fleet-{tag}.yaml"
    path.write_text(yaml.safe_dump(fleet))
    fh = open(out / f"up-{tag}.log", "wb")  # noqa: SIM115 - lives as long as the process
    return subprocess.Popen([sys.executable, "-m", "vllm_fleet.cli", "up", "-c", str(path)], stdout=fh,
                            stderr=subprocess.STDOUT)


def stop_up(up: subprocess.Popen[bytes], groups: set[int]) -> dict[str, Any]:
    t = time.monotonic()
    up.send_signal(signal.SIGTERM)
    rc = up.wait(120)
    took = time.monotonic() - t
    time.sleep(1)
    left = {g: group(g) for g in groups}
    return {"rc": rc, "stop_s": round(took, 1), "left_in_groups": {g: m for g, m in left.items() if m},
            "gpu_apps_after": gpu_apps(), "gpu_used_mib_after": gpu_used_mib()}


def chat_checks(models: list[str]) -> dict[str, Any]:
    c = openai.OpenAI(base_url=GW + "/v1", api_key="none", max_retries=0, timeout=60)
    res: dict[str, Any] = {}
    for m in models:
        r = c.chat.completions.create(model=m, messages=[{"role": "user", "content": "hi"}], max_tokens=16,
                                      extra_body={"ignore_eos": True})
        chunks = list(c.chat.completions.create(model=m, messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=16, stream=True, extra_body={"ignore_eos": True}))
        res[m] = {"completion_tokens": r.usage.completion_tokens if r.usage else None,
                  "stream_chunks": len(chunks), "model": r.model}
    return res


def placement(names: list[str]) -> dict[str, Any]:
    """Which GPUs each instance's process group has compute processes on."""
    groups = {n: i["pid"] for n, i in instances().items() if n in names}
    apps = gpu_apps()
    where: dict[str, list[int]] = {n: [] for n in groups}
    for gpu, procs in apps.items():
        for pid, _ in procs:
            for n, pg in groups.items():
                if pgid(pid) == pg and gpu not in where[n]:
                    where[n].append(gpu)
    return {"gpus_by_instance": where, "compute_apps": apps}


def bench(model_dir: str, base: str, served: str, out: Path, tag: str, prompts: int, conc: int,
          gw_pid: int | None, detailed: bool = False, clients: int = 1, shape: tuple[str, ...] = ()) -> dict[str, Any]:
    """One pass (bench_clients.py): its figures; with ``detailed`` every request's id, send time
    and TTFT too; with ``gw_pid`` the gateway's CPU per relayed event."""
    cpu0 = _cpu(gw_pid) if gw_pid else 0.0
    log(f"bench {tag}: {base} model={served} clients={clients}")
    r = bench_clients.run(model_dir, base, served, out, tag, prompts, conc, clients,
                          with_ids=detailed and "--request-id-prefix" in _bench_source(), shape=shape)
    if not detailed:
        for k in ("ids", "start_times", "ttfts"):
            r.pop(k)
    if gw_pid:
        cpu = _cpu(gw_pid) - cpu0
        events = (r.get("total_output_tokens") or 0) + 2 * (r.get("completed") or 0)  # tokens + role + [DONE]
        r["gateway_cpu_s"] = round(cpu, 2)
        r["gateway_cpu_us_per_event"] = round(cpu / max(1, events) * 1e6, 1)
    return r


@functools.cache
def _bench_source() -> str:
    """The source of this vLLM's serving benchmark: which flags it has (its --help is abridged)."""
    spec = importlib.util.find_spec("vllm.benchmarks.serve")
    return Path(spec.origin).read_text() if spec and spec.origin else ""


def _cpu(pid: int) -> float:
    cpu = bench_clients.cpu_seconds(pid)
    if cpu is None:
        raise RuntimeError(f"process {pid} is gone: no CPU figure for it")
    return cpu


def base_fleet(out: Path) -> dict[str, Any]:
    return {"gateway": {"host": "127.0.0.1", "port": 8080},
            "supervisor": {"startup_timeout_s": 400, "health_interval_s": 1, "health_failures": 3, "stop_grace_s": 30,
                           "backoff_initial_s": 1, "log_dir": str(out / "logs"), "state_dir": "/tmp/fleet-state",
                           "metrics_port": 9400, "progress_interval_s": 15}}


def inst(name: str, model_dir: str, gpus: list[int], served: list[str], port: int) -> dict[str, Any]:
    return {"name": name, "model": model_dir, "served_model_names": served, "gpus": gpus, "port": port,
            "gpu_memory_utilization": 0.25, "vllm_args": VLLM_ARGS,
            "env": {"VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}}


def pair(model_dir: str, out: Path, prompts: int, conc: int) -> dict[str, Any]:
    s: dict[str, Any] = {}
    s["vllm_fleet_gpus"] = subprocess.run([sys.executable, "-m", "vllm_fleet.cli", "gpus"], capture_output=True,
                                          text=True).stdout
    s["gpu_used_mib_before"] = gpu_used_mib()
    fleet = {**base_fleet(out), "instances": [inst("a", model_dir, [0], ["tiny-a", "tiny"], 8001),
                                              inst("b", model_dir, [1], ["tiny-b", "tiny"], 8002)]}
    t0 = time.monotonic()
    up = start_up(fleet, out, "pair")
    groups: set[int] = set()
    try:
        s["up_to_ready_s"] = round(wait(lambda: fleet_healthy(["a", "b"]) and len(instances()) == 3, 420,
                                        "pair ready"), 1)
        log(f"ready after {s['up_to_ready_s']} s")
        groups = {i["pid"] for i in instances().values()}
        s["fleet"] = httpx.get(GW + "/fleet").json()
        s["chat"] = chat_checks(["tiny-a", "tiny-b", "tiny"])
        s["placement"] = placement(["a", "b"])
        s["nvidia_smi_compute_apps"] = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv"],
            capture_output=True, text=True).stdout
        s["process_groups"] = {n: {"pgid": i["pid"], "members": group(i["pid"])} for n, i in instances().items()}
        gw_pid = instances()["gateway"]["pid"]
        s["bench_direct_b"] = bench(model_dir, "http://127.0.0.1:8002", "tiny-b", out, "direct-b", prompts, conc, None)
        s["bench_gateway_b"] = bench(model_dir, GW, "tiny-b", out, "gateway-b", prompts, conc, gw_pid)
        s["bench_gateway_replicas"] = bench(model_dir, GW, "tiny", out, "gateway-replicas", prompts * 2, conc * 2,
                                            gw_pid)
        s["orphans"] = orphan_check()
        groups |= {i["pid"] for i in instances().values()}
    finally:
        s["stop"] = stop_up(up, groups)
    s["total_s"] = round(time.monotonic() - t0, 1)
    return s


def orphan_check() -> dict[str, Any]:
    a = instances()["a"]
    old = a["pid"]
    members = group(old)
    gpu0_before = gpu_apps()[0]
    log(f"SIGKILL a's API server {old}; group {members}; GPU0 apps {gpu0_before}")
    t = time.monotonic()
    os.kill(old, signal.SIGKILL)
    res: dict[str, Any] = {"killed_pid": old, "group_before": members, "gpu0_apps_before": gpu0_before}
    timeline: list[tuple[float, str, list[int], list[tuple[int, int]], int | None]] = []
    new_pid = None
    while time.monotonic() - t < 400:
        now = round(time.monotonic() - t, 2)
        st = instances().get("a", {})
        alive = group(old)
        apps0 = gpu_apps()[0]
        if not timeline or timeline[-1][1] != st.get("state") or timeline[-1][2] != alive \
                or len(timeline[-1][3]) != len(apps0):
            timeline.append((now, str(st.get("state")), alive, apps0, st.get("pid")))
        if "group_empty_s" not in res and not alive:
            res["group_empty_s"] = now
            res["gpu0_apps_when_group_empty"] = apps0
            res["gpu0_used_mib_when_group_empty"] = gpu_used_mib()[0]
        if st.get("pid") not in (None, old) and new_pid is None:
            new_pid = st["pid"]
            res["respawned_s"] = now
            res["gpu0_apps_at_respawn"] = apps0
        if new_pid and st.get("state") == "RUNNING" and fleet_healthy(["a"]):
            res["in_rotation_again_s"] = now
            break
        time.sleep(0.2)
    res["timeline"] = timeline
    res["chat_after"] = chat_checks(["tiny-a"])
    res["restarts"] = instances()["a"]["restarts"]
    return res


def tp(model_dir: str, out: Path) -> dict[str, Any]:
    s: dict[str, Any] = {}
    i = inst("tp", model_dir, [0, 1], ["tiny-tp"], 8001)
    i["tensor_parallel_size"] = 2
    up = start_up({**base_fleet(out), "instances": [i]}, out, "tp")
    groups: set[int] = set()
    try:
        s["up_to_ready_s"] = round(wait(lambda: fleet_healthy(["tp"]) and len(instances()) == 2, 420, "tp ready"), 1)
        log(f"tp ready after {s['up_to_ready_s']} s")
        groups = {x["pid"] for x in instances().values()}
        s["fleet"] = httpx.get(GW + "/fleet").json()
        s["chat"] = chat_checks(["tiny-tp"])
        s["placement"] = placement(["tp"])
        s["process_groups"] = {n: {"pgid": x["pid"], "members": group(x["pid"])} for n, x in instances().items()}
    finally:
        s["stop"] = stop_up(up, groups)
    return s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("phase", choices=["pair", "tp"])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts", type=int, default=1024)
    ap.add_argument("--concurrency", type=int, default=256)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    pynvml.nvmlInit()
    s = pair(a.model_dir, out, a.prompts, a.concurrency) if a.phase == "pair" else tp(a.model_dir, out)
    (out / f"summary-{a.phase}.json").write_text(json.dumps(s, indent=1, default=str))
    print(json.dumps(s, indent=1, default=str)[-6000:])


if __name__ == "__main__":
    main()
