"""End to end on real vLLM (CPU build): ``vllm-fleet up`` with two instances of the generated tiny
model plus the gateway; the openai SDK talks to both models; SIGKILL of one vLLM API server (whose
EngineCore and Worker outlive it) ends in a restart that serves again; SIGTERM on ``up`` leaves
no process behind. Prints the figures the README quotes (up → ready, SIGKILL → serving again)."""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

from tests.supervisor.conftest import Reaper, free_port, group_alive, pgid_of, wait_until
from tests.supervisor.test_up import start_up, stop_leaves_nothing
from tests.support.real_vllm import CPU_VLLM_ARGS, CPU_VLLM_ENV

if TYPE_CHECKING:
    from pathlib import Path

pytest_plugins = ["tests.support.real_vllm"]
pytestmark = [pytest.mark.realvllm, pytest.mark.timeout(600)]


def _fleet(tmp_path: Path, model_dir: str) -> dict[str, Any]:
    env = {k: v for k, v in CPU_VLLM_ENV.items() if k != "CUDA_VISIBLE_DEVICES"}
    inst = {"model": model_dir, "device": "cpu", "vllm_args": list(CPU_VLLM_ARGS), "env": env}
    return {
        "gateway": {"host": "127.0.0.1", "port": free_port()},
        "supervisor": {"startup_timeout_s": 300, "health_interval_s": 1, "health_failures": 2, "stop_grace_s": 20,
                       "backoff_initial_s": 0.5, "log_dir": str(tmp_path / "logs"),
                       "state_dir": str(tmp_path / "state"), "metrics_port": free_port(), "progress_interval_s": 10},
        "instances": [{**inst, "name": "tiny-a", "served_model_names": ["tiny-a"], "port": free_port()},
                      {**inst, "name": "tiny-b", "served_model_names": ["tiny-b"], "port": free_port()}],
    }


def test_up_two_real_instances_restart_and_stop(tmp_path: Path, tiny_model_dir: str, reaper: Reaper) -> None:
    doc = _fleet(tmp_path, tiny_model_dir)
    t0 = time.monotonic()
    up, gw, sup = start_up(tmp_path, doc, reaper)
    try:
        children = up.wait_running(sup, timeout=300)
        client = openai.OpenAI(base_url=gw + "/v1", api_key="none", max_retries=0, timeout=60)

        def serves(model: str) -> bool:
            try:
                r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                                   max_tokens=4)
            except openai.APIError:
                return False
            return r.model == model and bool(r.choices)

        wait_until(lambda: serves("tiny-a") and serves("tiny-b"), 60, "both models through the gateway")
        print(f"\nup -> both models answering through the gateway: {time.monotonic() - t0:.1f} s")
        stream = client.chat.completions.create(model="tiny-b", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=8, stream=True, extra_body={"ignore_eos": True})
        assert len(list(stream)) > 4

        a = next(c for c in children if c["name"] == "tiny-a")
        old_pgid = a["pid"]
        workers = [p for p in reaper.alive() if pgid_of(p) == old_pgid and p != old_pgid]
        assert workers, "vLLM's EngineCore/Worker should share the API server's group"
        t1 = time.monotonic()
        os.kill(old_pgid, signal.SIGKILL)  # the API server alone: its workers survive it

        def restarted() -> list[dict[str, Any]]:
            return [c for c in up.instances(sup) if c["name"] == "tiny-a" and c["pid"] != old_pgid]

        wait_until(lambda: bool(restarted()), 60, "tiny-a respawned")
        # The new process was spawned only after the old group had emptied.
        assert not group_alive(old_pgid)
        wait_until(lambda: serves("tiny-a"), 300, "tiny-a serving again")
        print(f"SIGKILL of tiny-a's API server -> serving again through the gateway: {time.monotonic() - t1:.1f} s")
        assert restarted()[0]["restarts"] == 1
        assert serves("tiny-b")
        metrics = httpx.get(sup + "/metrics").text
        assert 'fleet_instance_restarts_total{instance="tiny-a"} 1.0' in metrics

        stop_leaves_nothing(up, sup, reaper)
    finally:
        if up.proc.poll() is None:
            os.killpg(up.proc.pid, signal.SIGKILL)
            up.proc.wait()
