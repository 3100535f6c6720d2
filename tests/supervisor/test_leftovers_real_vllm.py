"""Issue 18 #3 on real vLLM (CPU build): ``up`` SIGKILLed while a stream is running, then ``up``
again. Prints what of the old run outlived ``up`` (vLLM's API server gets SIGTERM from the kernel
and stops its EngineCore), what ``check`` then says, and how long the next ``up`` took to serve.
Old processes are followed by process group through /proc: setproctitle (EngineCore, workers)
overwrites the environment, so the test token cannot be relied on to find them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.supervisor.conftest import Reaper, free_port, wait_until
from tests.supervisor.test_up import Up
from tests.support.procs import group_members, pid_alive
from tests.support.real_vllm import CPU_VLLM_ARGS, CPU_VLLM_ENV

pytest_plugins = ["tests.support.real_vllm"]
pytestmark = [pytest.mark.realvllm, pytest.mark.timeout(600)]


def _fleet(tmp_path: Path, model_dir: str) -> dict[str, Any]:
    env = {k: v for k, v in CPU_VLLM_ENV.items() if k != "CUDA_VISIBLE_DEVICES"}
    return {
        "gateway": {"host": "127.0.0.1", "port": free_port()},
        "supervisor": {"startup_timeout_s": 300, "health_interval_s": 1, "stop_grace_s": 20,
                       "log_dir": str(tmp_path / "logs"), "state_dir": str(tmp_path / "state"),
                       "metrics_port": free_port(), "progress_interval_s": 10},
        "instances": [{"name": "tiny-a", "model": model_dir, "served_model_names": ["tiny-a"], "device": "cpu",
                       "port": free_port(), "vllm_args": list(CPU_VLLM_ARGS), "env": env}],
    }


def _chat(gw: str) -> bool:
    body = {"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    try:
        return httpx.post(f"{gw}/v1/chat/completions", json=body, timeout=60).status_code == 200
    except httpx.HTTPError:
        return False


def _stream_until_cut(gw: str, events: list[int]) -> None:
    body = {"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20000,
            "stream": True, "ignore_eos": True}
    try:
        with httpx.stream("POST", f"{gw}/v1/chat/completions", json=body, timeout=60) as resp:
            for _ in resp.iter_lines():
                events[0] += 1
    except httpx.HTTPError:
        pass


def test_sigkill_up_while_serving_then_up_again(tmp_path: Path, tiny_model_dir: str, reaper: Reaper) -> None:
    doc = _fleet(tmp_path, tiny_model_dir)
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    gw = f"http://127.0.0.1:{doc['gateway']['port']}"
    sup = f"http://127.0.0.1:{doc['supervisor']['metrics_port']}"
    argv = [sys.executable, "-m", "vllm_fleet.cli", "up", "-c", str(path)]
    env = {"FLEET_HEALTH_INTERVAL_S": "0.5", "FLEET_HEALTH_SUCCESSES": "1"}
    ups: list[Up] = []
    old_groups: set[int] = set()
    try:
        ups.append(Up(argv, tmp_path, reaper, env=env))
        first = ups[0]
        leaders = {c["name"]: c["pid"] for c in first.wait_running(sup, timeout=300)}
        wait_until(lambda: _chat(gw), 60, "tiny-a answering through the gateway")
        old_groups = set(leaders.values())
        old = {p for g in old_groups for p in group_members(g)}
        events = [0]
        streaming = threading.Thread(target=_stream_until_cut, args=(gw, events), daemon=True)
        streaming.start()
        wait_until(lambda: events[0] > 20, 30, "a stream under way")

        t0 = time.monotonic()
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(10)
        # vLLM's API server gets SIGTERM from the kernel and stops its engine; give it the time.
        gone = wait_until_quiet(old, 30)
        left = sorted(p for g in old_groups for p in group_members(g))
        print(f"\nup SIGKILLed mid-stream ({events[0]} events): {len(old) - len(left)} of the {len(old)} processes "
              f"of the old groups exited with it within {gone:.1f}s; left: {left}")
        streaming.join(30)

        checked = subprocess.run([sys.executable, "-m", "vllm_fleet.cli", "check", "-c", str(path)],
                                 capture_output=True, text=True, timeout=60)
        print(f"check: exit {checked.returncode}\n{checked.stderr.strip()}")
        assert checked.returncode == (2 if left else 0), checked.stderr

        t1 = time.monotonic()
        ups.append(Up(argv, tmp_path, reaper, env=env))
        second = ups[1]
        now = second.wait_running(sup, timeout=300)
        assert {c["pid"] for c in now}.isdisjoint(old_groups)
        wait_until(lambda: _chat(gw), 60, "tiny-a answering again")
        print(f"second up -> serving through the gateway: {time.monotonic() - t1:.1f}s "
              f"({time.monotonic() - t0:.1f}s after the SIGKILL)")
        for g in old_groups:
            assert group_members(g) == [], f"old process group {g} still has {group_members(g)}"

        new_groups = {c["pid"] for c in now}
        second.proc.send_signal(signal.SIGTERM)
        assert second.proc.wait(90) == 0, second.output()[-3000:]
        assert all(group_members(g) == [] for g in new_groups | old_groups)
        assert not (tmp_path / "state" / "processes.json").exists()
    finally:
        for up in ups:
            if up.proc.poll() is None:
                os.killpg(up.proc.pid, signal.SIGKILL)
                up.proc.wait()
        for g in old_groups:  # what the test itself may have left: the old run's groups
            if group_members(g):
                os.killpg(g, signal.SIGKILL)


def wait_until_quiet(pids: set[int], limit_s: float) -> float:
    """Seconds until every pid in ``pids`` is gone (or a zombie), at most ``limit_s``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s and any(map(pid_alive, pids)):
        time.sleep(0.1)
    return time.monotonic() - t0
