"""Live changes on real vLLM (CPU build): while openai SDK streams run on tiny-a, a reload adds
tiny-c and removes tiny-b. No request fails, tiny-c answers, tiny-b's processes are gone."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
import yaml

from tests.supervisor.conftest import Reaper, free_port, wait_until
from tests.supervisor.test_up import start_up
from tests.support.real_vllm import CPU_VLLM_ARGS, CPU_VLLM_ENV

if TYPE_CHECKING:
    from pathlib import Path

pytest_plugins = ["tests.support.real_vllm"]
pytestmark = [pytest.mark.realvllm, pytest.mark.timeout(900)]


def test_reload_adds_and_removes_real_instances_under_streams(tmp_path: Path, tiny_model_dir: str,
                                                              reaper: Reaper) -> None:
    env = {k: v for k, v in CPU_VLLM_ENV.items() if k != "CUDA_VISIBLE_DEVICES"}
    inst: dict[str, Any] = {"model": tiny_model_dir, "device": "cpu", "vllm_args": list(CPU_VLLM_ARGS), "env": env}
    doc: dict[str, Any] = {
        "gateway": {"host": "127.0.0.1", "port": free_port()},
        "supervisor": {"startup_timeout_s": 300, "health_interval_s": 1, "stop_grace_s": 20,
                       "log_dir": str(tmp_path / "logs"), "state_dir": str(tmp_path / "state"),
                       "metrics_port": free_port(), "progress_interval_s": 10},
        # The CPU build binds every instance's worker to the same core unless told otherwise; one
        # starting beside a busy one on that core took over 5 minutes here. One core each.
        "instances": [{**inst, "name": n, "served_model_names": [n], "port": free_port(),
                       "env": {**env, "VLLM_CPU_OMP_THREADS_BIND": core}}
                      for n, core in (("tiny-a", "0"), ("tiny-b", "1"))],
    }
    path = tmp_path / "fleet.yaml"  # start_up writes it there; the reload below rewrites it
    up, gw, sup = start_up(tmp_path, doc, reaper)
    stop = threading.Event()
    try:
        up.wait_running(sup, timeout=300)
        wait_until(lambda: httpx.get(gw + "/ready").status_code == 200, 60, "the gateway ready")
        client = openai.OpenAI(base_url=gw + "/v1", api_key="none", max_retries=0, timeout=300)
        failures: list[str] = []
        finished: list[str] = []

        def streams() -> None:
            # One client, with pauses: two cores must also start tiny-c meanwhile (a CPU vLLM pins its
            # worker to a core; a core kept at 100 % by another instance slows a start to minutes).
            while not stop.wait(0.5):
                try:
                    finish = None
                    for chunk in client.chat.completions.create(
                            model="tiny-a", messages=[{"role": "user", "content": "tell me"}], max_tokens=32,
                            stream=True, extra_body={"ignore_eos": True}):
                        if chunk.choices and chunk.choices[0].finish_reason:
                            finish = chunk.choices[0].finish_reason
                    finished.append(str(finish))
                except openai.APIError as e:
                    failures.append(repr(e))

        threads = [threading.Thread(target=streams, daemon=True)]
        for t in threads:
            t.start()
        wait_until(lambda: len(finished) >= 2, 60, "streams on tiny-a")
        b_pid = next(i["pid"] for i in up.instances(sup) if i["name"] == "tiny-b")
        doc["instances"] = [doc["instances"][0], {**inst, "name": "tiny-c", "served_model_names": ["tiny-c"],
                                                  "port": free_port(),
                                                  "env": {**env, "VLLM_CPU_OMP_THREADS_BIND": "1"}}]
        path.write_text(yaml.safe_dump(doc))
        done = subprocess.run([sys.executable, "-m", "vllm_fleet.cli", "reload", "-c", str(path), "--wait", "600"],
                              capture_output=True, text=True, timeout=700)
        assert done.returncode == 0, done.stdout + done.stderr
        wait_until(lambda: httpx.get(gw + "/ready", params={"model": "tiny-c"}).status_code == 200, 60,
                   "tiny-c in rotation")
        r = client.chat.completions.create(model="tiny-c", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert r.model == "tiny-c" and r.choices
        stop.set()
        for t in threads:
            t.join(120)
        assert failures == [], failures[:3]
        assert len(finished) >= 4 and set(finished) == {"length"}
        assert [m.id for m in client.models.list().data] == ["tiny-a", "tiny-c"]
        assert b_pid not in reaper.alive()
        print(f"\n{len(finished)} streams on tiny-a during the reload, none failed")
    finally:
        stop.set()  # also when an assertion failed: the client thread must not outlive the test
        up.proc.terminate()
        up.proc.wait(60)
    assert reaper.alive() == []
