"""More models than memory on real vLLM (CPU build, cold mode: the CPU build has no sleep mode):
two instances of the tiny model whose shares of the host allow one awake. A request for the
sleeping model swaps them; a long stream on the first is not cut; the openai SDK sees no error."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

from tests.supervisor.conftest import Reaper, free_port, wait_until
from tests.supervisor.test_up import start_up
from tests.support.real_vllm import CPU_VLLM_ARGS, CPU_VLLM_ENV

if TYPE_CHECKING:
    from pathlib import Path

pytest_plugins = ["tests.support.real_vllm"]
pytestmark = [pytest.mark.realvllm, pytest.mark.timeout(900)]


def test_cold_swap_between_two_real_models(tmp_path: Path, tiny_model_dir: str, reaper: Reaper) -> None:
    env = {k: v for k, v in CPU_VLLM_ENV.items() if k != "CUDA_VISIBLE_DEVICES"}
    inst: dict[str, Any] = {"model": tiny_model_dir, "device": "cpu", "vllm_args": list(CPU_VLLM_ARGS), "env": env}
    doc = {
        "gateway": {"host": "127.0.0.1", "port": free_port()},
        "supervisor": {"startup_timeout_s": 300, "health_interval_s": 1, "health_failures": 2, "stop_grace_s": 20,
                       "log_dir": str(tmp_path / "logs"), "state_dir": str(tmp_path / "state"),
                       "metrics_port": free_port(), "progress_interval_s": 10},
        "swap": {"hold_s": 5},
        # Default shares (gpu_memory_utilization 0.9) of one host: one awake at a time.
        "instances": [{**inst, "name": "tiny-a", "served_model_names": ["tiny-a"], "port": free_port(),
                       "sleep": {"preload": True}},
                      {**inst, "name": "tiny-b", "served_model_names": ["tiny-b"], "port": free_port(),
                       "sleep": {}}],
    }
    up, gw, sup = start_up(tmp_path, doc, reaper)

    def states() -> dict[str, str]:
        return {i["name"]: i["state"] for i in up.instances(sup)}

    try:
        wait_until(lambda: states() == {"tiny-a": "RUNNING", "tiny-b": "SLEEPING", "gateway": "RUNNING"}, 300,
                   "tiny-a up, tiny-b asleep (cold: never started)")
        client = openai.OpenAI(base_url=gw + "/v1", api_key="none", max_retries=0, timeout=600)
        wait_until(lambda: httpx.get(gw + "/ready").status_code == 200, 60, "the gateway ready")
        models = {m.id: (m.model_extra or {}).get("state") for m in client.models.list().data}
        assert models == {"tiny-a": "awake", "tiny-b": "asleep"}

        streamed: dict[str, Any] = {}
        first_chunk = threading.Event()

        def long_stream() -> None:
            text, finish = [], None
            for chunk in client.chat.completions.create(
                    model="tiny-a", messages=[{"role": "user", "content": "tell me a story"}], max_tokens=400,
                    stream=True, extra_body={"ignore_eos": True}):
                first_chunk.set()
                if chunk.choices:
                    text.append(chunk.choices[0].delta.content or "")
                    finish = chunk.choices[0].finish_reason or finish
            streamed.update(text="".join(text), finish=finish, ended=time.monotonic())

        t = threading.Thread(target=long_stream, daemon=True)
        t.start()
        # The first chunk, not a metric: a loaded 2-core CI machine can take a while to the first token.
        assert first_chunk.wait(180), "the stream on tiny-a did not start"
        t0 = time.monotonic()
        r = client.chat.completions.create(model="tiny-b", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=8, extra_body={"ignore_eos": True})
        took = time.monotonic() - t0
        t.join(120)
        assert r.model == "tiny-b" and r.usage is not None and r.usage.completion_tokens == 8
        assert streamed["finish"] == "length" and streamed["text"], "the stream on tiny-a was cut"
        assert streamed["ended"] <= t0 + took, "tiny-b was served before tiny-a's stream ended"
        assert states() == {"tiny-a": "SLEEPING", "tiny-b": "RUNNING", "gateway": "RUNNING"}
        print(f"\nrequest for the sleeping model served after {took:.1f}s (waited for a 400-token stream, "
              "then a cold swap)")
        # And back: tiny-b is idle now, so the swap starts at once.
        t0 = time.monotonic()
        r = client.chat.completions.create(model="tiny-a", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=4)
        print(f"swap back to tiny-a: {time.monotonic() - t0:.1f}s")
        assert r.model == "tiny-a" and states()["tiny-b"] == "SLEEPING"
        metrics = httpx.get(sup + "/metrics").text
        assert 'fleet_swaps_total{reason="swap"} 2.0' in metrics
        assert 'fleet_wake_seconds_count{instance="tiny-b",mode="cold"} 1.0' in metrics
    finally:
        up.proc.terminate()
        up.proc.wait(60)
    assert reaper.alive() == []
