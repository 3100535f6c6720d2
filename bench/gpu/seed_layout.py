"""Seed 001's layout on four GPUs (issue 23): a "14B-style" random-weight Llama TP=2 on GPUs 0,1, an
"8B-style" one TP=2 on GPUs 2,3, and a third model TP=2 on GPUs 2,3 too, asleep by default, all
from the fleet file `vllm-fleet plan` writes, started by `vllm-fleet up`, behind the gateway.

    python3 bench/gpu/seed_layout.py prepare start   # models, gpus, plan, check; `up` (setsid), wait for ready
    python3 bench/gpu/seed_layout.py wait measure    # (more waiting), isolation, chat, /fleet, tiers, wake
    python3 bench/gpu/seed_layout.py orphan stop     # SIGKILL the first's API server under load; stop all

Phases run in the order given, within ``--deadline-s`` (one device call is at most 10 minutes);
one that cannot finish in time says which to run next. State lives under ``--out`` (default
/tmp/seed-run) between calls; each phase writes OUT/<phase>.json. ``--rehearse`` runs every phase
on a host without GPUs: fake vLLMs (tests/fakes/fake_vllm.py) on four GPUs that a stand-in
nvidia-smi reports, models as bare config.json files, NVML readings skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from seed_fleet import FAKE_SMI, MODELS, READY, REPO, SHAPE, L, M, Q, Run, log
from seed_measure import measure, orphan

# -- prepare -------------------------------------------------------------------------------------


def prepare(run: Run) -> dict[str, Any]:
    out, rehearse = run.out, run.rehearse
    (out / "mode.json").write_text(json.dumps({"rehearse": rehearse}))
    if rehearse:
        (out / "fake-bin").mkdir(exist_ok=True)
        (out / "fake-bin" / "nvidia-smi").write_text(FAKE_SMI)
        (out / "fake-bin" / "nvidia-smi").chmod(0o755)
    res: dict[str, Any] = {"rehearse": rehearse, "models": {}}
    models = Path("/tmp/seed-models") if not rehearse else out / "models"
    for name, layers, _ in MODELS:
        d = models / name
        t = time.monotonic()
        if rehearse:
            d.mkdir(parents=True, exist_ok=True)
            (d / "config.json").write_text(json.dumps(
                {"model_type": "llama", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": layers,
                 "num_attention_heads": 24, "num_key_value_heads": 8, "vocab_size": 515,
                 "max_position_embeddings": 2048, "torch_dtype": "bfloat16"}))
        else:
            made = run.cli("make-tiny-model", str(d), "--layers", str(layers), *SHAPE, "--device", "cuda", timeout=400)
            if made.returncode:
                raise RuntimeError(f"make-tiny-model {name}: {made.stderr[-2000:]}")
        size = sum(f.stat().st_size for f in d.glob("*.safetensors")) / 1e9
        res["models"][name] = {"layers": layers, "weights_gb": round(size, 2), "made_s": round(time.monotonic() - t, 1)}
        log(f"model {name}: {res['models'][name]}")
    res["vllm_fleet_gpus"] = run.cli("gpus").stdout
    argv = ["plan", "--context", "2048"]
    for name, _, served in MODELS:
        argv += ["--model", str(models / name), "--served-name", served]
    argv += ["--asleep"]
    planned = run.cli(*argv, "--fleet-file", str(out / "planned.yaml"))
    res["plan_rc"], res["plan"] = planned.returncode, planned.stdout + planned.stderr
    if planned.returncode:
        raise RuntimeError(f"vllm-fleet plan exited {planned.returncode}: {planned.stderr[-2000:]}")
    res["plan_json"] = json.loads(run.cli(*argv, "--json").stdout)
    doc = yaml.safe_load((out / "planned.yaml").read_text())
    got = [(i["name"], i["gpus"], i["tensor_parallel_size"], i.get("sleep")) for i in doc["instances"]]
    res["planned_layout"] = got
    if got != [(Q, [0, 1], 2, None), (L, [2, 3], 2, {"preload": True}), (M, [2, 3], 2, {})]:
        raise RuntimeError(f"the plan is not Seed 001's layout: {got}")
    (out / "fleet.yaml").write_text(yaml.safe_dump(overlay(doc, out, rehearse), sort_keys=False))
    check = run.cli("check", "-c", str(out / "fleet.yaml"))
    res["check_rc"], res["check"] = check.returncode, check.stdout + check.stderr
    if check.returncode:
        raise RuntimeError(f"vllm-fleet check exited {check.returncode}: {check.stderr[-2000:]}")
    res["infernet_config"] = json.loads(run.cli("infernet-config", "-c", str(out / "fleet.yaml")).stdout)
    return res


def overlay(planned: dict[str, Any], out: Path, rehearse: bool) -> dict[str, Any]:
    """The planned file plus what a measured run needs: the supervisor's endpoint and state under
    OUT, and --enforce-eager as in every GPU run so far (comparable start-up and wake figures).
    Instances keep the planned GPUs, sizes, shares and sleep blocks."""
    doc = dict(planned)
    doc["supervisor"] = {"startup_timeout_s": 600, "health_interval_s": 1, "stop_grace_s": 30,
                         "log_dir": str(out / "logs"), "state_dir": str(out / "state"), "metrics_port": 9400,
                         "progress_interval_s": 15}
    doc["instances"] = [{**i, "vllm_args": [*i["vllm_args"], "--enforce-eager"]} for i in planned["instances"]]
    if rehearse:
        # The tests' free_port: never the same port twice (the kernel may give one ephemeral port
        # to two binds in a row). The rehearsal runs from the repository, which has tests/.
        sys.path.insert(0, str(REPO))
        from tests.support.procs import free_port as free

        doc["vllm_command"] = ["python", str(REPO / "tests" / "fakes" / "fake_vllm.py")]
        doc["gateway"] = {"host": "127.0.0.1", "port": free()}
        doc["supervisor"]["metrics_port"] = free()
        doc["instances"] = [{**i, "port": free(), "vllm_args": [*i["vllm_args"], "--fake-workers", "1",
                                                                "--fake-startup-delay", "1"]}
                            for i in doc["instances"]]
    return doc


# -- start / wait --------------------------------------------------------------------------------


def start(run: Run) -> dict[str, Any]:
    fh = open(run.out / "up.log", "ab")  # noqa: SIM115 - the fleet outlives this call
    up = subprocess.Popen([sys.executable, "-m", "vllm_fleet.cli", "up", "-c", str(run.out / "fleet.yaml")],
                          cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, env=run.env())
    (run.out / "up.pid").write_text(str(up.pid))
    (run.out / "started_at").write_text(str(time.time()))
    log(f"vllm-fleet up: pid {up.pid}")
    return {"up_pid": up.pid, "gpu_used_mib_before": run.gpus.used_mib(), **wait_ready(run)}


def wait_ready(run: Run) -> dict[str, Any]:
    since = float((run.out / "started_at").read_text())
    run.wait(lambda: run.states() == READY, 900, "the fleet ready")
    run.wait(lambda: _get(run.gw + "/ready") == 200, 60, "the gateway ready")
    text = (run.out / "up.log").read_text(errors="replace")
    res = {"up_to_ready_s": round(time.time() - since, 1),
           "cold_start_s": {m.group(1): float(m.group(2)) for m in
                            re.finditer(r"\[fleet\] (\S+): STARTING -> RUNNING after ([0-9.]+)s", text)},
           "start_order": re.findall(r"\[fleet\] (\S+): STOPPED -> STARTING", text),
           "groups": {n: i["pid"] for n, i in run.instances().items()}}
    (run.out / "groups.json").write_text(json.dumps(res["groups"]))
    log(f"ready: {res}")
    return res


def _get(url: str) -> int:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return 0


# -- stop ----------------------------------------------------------------------------------------


def stop(run: Run) -> dict[str, Any]:
    pid = int((run.out / "up.pid").read_text())
    groups = json.loads((run.out / "groups.json").read_text()) if (run.out / "groups.json").exists() else {}
    t = time.monotonic()
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return {"up": "already gone"}
    while _alive(pid) and time.monotonic() - t < 120:
        time.sleep(0.2)
    took = round(time.monotonic() - t, 1)
    time.sleep(1)
    return {"stop_s": took, "up_alive": _alive(pid),
            "left_in_groups": {n: run.gpus.group(g) for n, g in groups.items() if run.gpus.group(g)},
            "gpu_apps_after": run.gpus.apps([0, 1, 2, 3]), "gpu_used_mib_after": run.gpus.used_mib()}


def _alive(pid: int) -> bool:
    """Running, not a zombie (``up`` is this process's child when start and stop share a call)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# -- main ----------------------------------------------------------------------------------------

PHASES = ("prepare", "start", "wait", "measure", "orphan", "stop")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("phases", nargs="+", choices=PHASES)
    ap.add_argument("--out", default="/tmp/seed-run")
    ap.add_argument("--deadline-s", type=float, default=560.0, help="for all the phases of this call together")
    ap.add_argument("--rounds", type=int, default=3, help="wake measurements per model (measure)")
    ap.add_argument("--rehearse", action="store_true", help="prepare a rehearsal without GPUs (see the docstring)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    run = Run(out, time.monotonic() + a.deadline_s, a.rehearse)
    for i, phase in enumerate(a.phases):
        log(f"phase {phase} ({run.left():.0f}s left in this call)")
        res: dict[str, Any] = {}
        try:
            res = {"prepare": lambda: prepare(run), "start": lambda: start(run),
                   "wait": lambda: wait_ready(run), "measure": lambda: measure(run, a.rounds),
                   "orphan": lambda: orphan(run), "stop": lambda: stop(run)}[phase]()
            res["ok"] = True
        except Exception as e:  # the phase's partial results and why it stopped, for the next call
            res.update(ok=False, error=repr(e)[:2000])
            rest = " ".join(("wait", *a.phases[i + 1:]) if isinstance(e, TimeoutError) else a.phases[i + 1:])
            res["next"] = f"bash bench/gpu/seed_run.sh {rest}".strip() if rest else None
        (out / f"{phase}.json").write_text(json.dumps(res, indent=1, default=str))
        print(json.dumps(res, default=str)[-3000:], flush=True)
        if not res["ok"]:
            log(f"phase {phase} failed: {res['error'][:500]}; next: {res.get('next')}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
