"""The measurements of a Seed 001 run (bench/gpu/seed_layout.py) on a fleet that is up: isolation,
chat through the gateway (openai SDK, streamed and not), /fleet and the Infernet tiers, the third
model's wake (time to its first token through the gateway) while the first model serves, and a
SIGKILLed API server's way back while the second model serves."""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import threading
import time
from typing import Any

import httpx
from seed_fleet import L, M, Q, Run, log


def chat(run: Run, model: str, stream: bool) -> dict[str, Any]:
    import openai

    c = openai.OpenAI(base_url=run.gw + "/v1", api_key="none", max_retries=0, timeout=120)
    msgs: Any = [{"role": "user", "content": "hello there"}]
    t = time.monotonic()
    if not stream:
        r = c.chat.completions.create(model=model, messages=msgs, max_tokens=16, extra_body={"ignore_eos": True})
        return {"s": round(time.monotonic() - t, 3), "tokens": r.usage.completion_tokens if r.usage else None}
    ttft, chunks = None, 0
    for chunk in c.chat.completions.create(model=model, messages=msgs, max_tokens=16, stream=True,
                                           extra_body={"ignore_eos": True}):
        chunks += 1
        if ttft is None and chunk.choices and chunk.choices[0].delta.content:
            ttft = time.monotonic() - t
    return {"s": round(time.monotonic() - t, 3), "ttft_s": None if ttft is None else round(ttft, 3), "chunks": chunks}


class Load:
    """Requests for one model back to back (streamed and not, in turn) from two threads."""

    def __init__(self, run: Run, model: str) -> None:
        self.run, self.model = run, model
        self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(i % 2 == 0,)) for i in range(2)]

    def _loop(self, stream: bool) -> None:
        while not self._stop.is_set():
            try:
                chat(self.run, self.model, stream)
                self.ok += 1
            except Exception as e:  # every failure counts, whatever raised it
                self.failures.append(f"{time.strftime('%H:%M:%S')} {e!r}"[:300])
            stream = not stream

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(180)

    def result(self) -> dict[str, Any]:
        return {"model": self.model, "ok": self.ok, "failed": len(self.failures), "failures": self.failures[:10]}


def measure(run: Run, rounds: int) -> dict[str, Any]:
    res: dict[str, Any] = {"nvidia_smi": run.gpus.smi(), "placement": run.gpus.placement(run.instances())}
    res["isolation_ok"] = res["placement"]["by_instance"] == {Q: [0, 1], L: [2, 3], M: [2, 3]}
    log(f"placement: {res['placement']['by_instance']} (ok={res['isolation_ok']})")
    res["chat"] = {m: {"plain": chat(run, m, False), "stream": chat(run, m, True)}
                   for m in ("qwen2.5:14b", "llama3.1:8b", "mistral:7b", "llama3.1:8b")}  # the last two swap
    res["fleet"] = httpx.get(run.gw + "/fleet", timeout=5).json()
    res["infernet_json"] = json.loads((run.out / "state" / "infernet.json").read_text())
    res["status"] = run.cli("status", "--url", run.gw, "--supervisor-url", run.sup).stdout
    res["tiers"] = {"node": res["fleet"].get("vram_tier"),
                    "instances": {b["name"]: b.get("vram_tier") for b in res["fleet"].get("backends", [])}}
    wakes: list[dict[str, Any]] = []
    with Load(run, "qwen2.5:14b") as first:
        for _ in range(rounds):
            for target, other in (("mistral:7b", L), ("llama3.1:8b", M)):
                asleep = M if other == L else L

                def swapped(asleep: str = asleep, other: str = other) -> bool:
                    states = run.states()
                    return states.get(asleep) == "SLEEPING" and states.get(other) == "RUNNING"

                run.wait(swapped, 120, "one awake on GPUs 2,3")
                time.sleep(1.5)  # the awake one idle past the policy's quiet second
                before = run.gpus.used_mib()
                r = chat(run, target, True)
                wakes.append({"model": target, "ttft_s": r["ttft_s"], "used_mib_before": before,
                              "used_mib_after": run.gpus.used_mib(), "states": run.states()})
                log(f"wake {target}: first token after {r['ttft_s']} s")
    res["first_group_during_swaps"] = first.result()
    for model in ("mistral:7b", "llama3.1:8b"):
        vals = [w["ttft_s"] for w in wakes if w["model"] == model and w["ttft_s"] is not None]
        res[f"wake_ttft_{model}"] = {"all_s": vals, "p50_s": statistics.median(vals) if vals else None,
                                     "max_s": max(vals) if vals else None}
    res["wakes"] = wakes
    up_log = (run.out / "up.log").read_text(errors="replace")
    res["vllm_wake_s"] = re.findall(r"\[(\S+)\] .*It took ([0-9.]+) seconds to wake up", up_log)
    res["vllm_sleep_s"] = re.findall(r"\[(\S+)\] .*It took ([0-9.]+) seconds to fall asleep", up_log)
    res["supervisor_metrics"] = [ln for ln in httpx.get(run.sup + "/metrics", timeout=5).text.splitlines()
                                 if ln.startswith(("fleet_swaps_total", "fleet_wake_seconds_sum",
                                                   "fleet_wake_seconds_count", "fleet_instance_restarts_total"))]
    return res


# -- orphan --------------------------------------------------------------------------------------


def orphan(run: Run) -> dict[str, Any]:
    """SIGKILL the first instance's API server while the second serves: its group and both its GPUs
    are freed, it restarts, and the second fails no request meanwhile."""
    old = run.instances()[Q]["pid"]
    res: dict[str, Any] = {"killed_pid": old, "group_before": run.gpus.group(old),
                           "gpus_before": run.gpus.apps([0, 1]), "used_mib_before": run.gpus.used_mib()}
    timeline: list[list[Any]] = []
    with Load(run, "llama3.1:8b") as second:
        time.sleep(2)
        t = time.monotonic()
        os.kill(old, signal.SIGKILL)
        log(f"SIGKILL {Q}'s API server {old}")
        while time.monotonic() - t < min(480, run.left()):
            now = round(time.monotonic() - t, 2)
            inst = run.instances().get(Q, {})
            alive, apps = run.gpus.group(old), run.gpus.apps([0, 1])
            row = [now, inst.get("state"), inst.get("pid"), len(alive), sum(len(a) for a in apps.values())]
            if not timeline or timeline[-1][1:] != row[1:]:
                timeline.append(row)
            if "group_empty_s" not in res and not alive:
                res["group_empty_s"] = now
            if "gpus_freed_s" not in res and not alive and not any(apps.values()):
                res["gpus_freed_s"], res["used_mib_when_freed"] = now, run.gpus.used_mib()
            if "respawned_s" not in res and inst.get("pid") not in (None, old):
                res["respawned_s"] = now
            if "running_s" not in res and "respawned_s" in res and inst.get("state") == "RUNNING":
                res["running_s"] = now
            if "running_s" in res and _in_rotation(run, Q):
                res["in_rotation_s"] = now
                res["serving_s"] = round(time.monotonic() - t + chat(run, "qwen2.5:14b", False)["s"], 2)
                break
            time.sleep(0.2)
    res["timeline"] = timeline  # [s, state, pid, group members alive, compute processes on GPUs 0,1]
    res["second_during_restart"] = second.result()
    res["restarts"] = run.instances().get(Q, {}).get("restarts")
    res["placement_after"] = run.gpus.placement(run.instances())
    return res


def _in_rotation(run: Run, name: str) -> bool:
    try:
        backends = httpx.get(run.gw + "/fleet", timeout=2).json()["backends"]
    except (httpx.HTTPError, ValueError, KeyError):
        return False
    return any(b["name"] == name and b["healthy"] for b in backends)
