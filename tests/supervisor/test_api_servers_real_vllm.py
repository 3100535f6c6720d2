"""An instance with two vLLM API servers (``--api-server-count 2``) under ``vllm-fleet up``, real
vLLM (CPU build, tests/support/vllm_serve.py as its ``vllm serve``): both API servers under the
instance's launcher; the gateway's pool evened out over the two (/fleet's ``per_api_server``);
requests one after another keep to one connection, requests at once go to both API servers (each
connection stays with the API server that accepted it: gateway/upstream.py's pick); a SIGKILL of
one API server restarts the instance whole; SIGTERM on ``up`` leaves no process behind."""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.supervisor.conftest import Reaper, free_port, group_alive, pgid_of, wait_until
from tests.supervisor.test_up import start_up, stop_leaves_nothing
from tests.support.bench_gpu import load
from tests.support.real_vllm import CPU_VLLM_ARGS, CPU_VLLM_ENV

pytest_plugins = ["tests.support.real_vllm"]
pytestmark = [pytest.mark.realvllm, pytest.mark.timeout(600)]

SERVE = Path(__file__).resolve().parents[1] / "support" / "vllm_serve.py"
SEQS = 16  # --max-num-seqs: the gateway's warm pool to the instance


def _api_servers(pid: int) -> list[int]:
    """The instance's API server processes: vLLM retitles them (``VLLM::APIServer_N``), which also
    overwrites the environment the reaper looks for, so they are found as the launcher's children."""
    return [p for p in load("in_pass").descendants(pid) if "APIServer" in load("api_split")._name(p)]


def test_two_api_servers_both_serve_the_gateway_and_restart_whole(tmp_path: Path, tiny_model_dir: str,
                                                                  reaper: Reaper) -> None:
    api_split = load("api_split")
    env = {k: v for k, v in CPU_VLLM_ENV.items() if k != "CUDA_VISIBLE_DEVICES"}
    port = free_port()
    doc = {
        "gateway": {"host": "127.0.0.1", "port": free_port()},
        "vllm_command": ["python", str(SERVE)],
        "supervisor": {"startup_timeout_s": 300, "health_interval_s": 1, "health_failures": 2, "stop_grace_s": 20,
                       "backoff_initial_s": 0.5, "log_dir": str(tmp_path / "logs"),
                       "state_dir": str(tmp_path / "state"), "metrics_port": free_port()},
        "instances": [{"name": "a", "model": tiny_model_dir, "device": "cpu", "served_model_names": ["tiny-a"],
                       "port": port, "env": env,
                       "vllm_args": [*CPU_VLLM_ARGS, "--max-num-seqs", str(SEQS), "--api-server-count", "2"]}],
    }
    up, gw, sup = start_up(tmp_path, doc, reaper)
    try:
        children = up.wait_running(sup, timeout=300)
        client = openai.OpenAI(base_url=gw + "/v1", api_key="none", max_retries=0, timeout=60)

        def serves() -> bool:
            try:
                r = client.chat.completions.create(model="tiny-a", messages=[{"role": "user", "content": "hi"}],
                                                   max_tokens=4)
            except openai.APIError:
                return False
            return bool(r.choices)

        wait_until(serves, 120, "tiny-a through the gateway")
        a = next(c for c in children if c["name"] == "a")["pid"]
        gateway = next(c for c in children if c["name"] == "gateway")["pid"]
        servers = _api_servers(a)
        assert len(servers) == 2, [api_split._name(p) for p in load("in_pass").descendants(a)]
        gateway_pids = [gateway, *load("in_pass").descendants(gateway)]

        def pool() -> dict[str, tuple[int, int | None, int, int]]:
            return {k: c for k, c in api_split.snapshot({"a": port}, {"a": a})["conns"]["a"].items()
                    if c[1] in gateway_pids}

        wait_until(lambda: len(pool()) >= SEQS, 30, "the gateway's warm pool open")

        # Which API server accepts a connection is the kernel's: a pool of 16 opened at once went
        # wholly to one in every run before the warmer evened it out (gateway/accept_split.py).
        def split() -> list[int]:
            now = pool()
            return sorted((sum(1 for c in now.values() if c[0] == s) for s in servers), reverse=True)

        def even() -> bool:
            fleet = httpx.get(gw + "/fleet", timeout=5).json()["backends"][0]["connections"]["per_api_server"]
            # the kernel's count may hold one or two more: the gateway's health probes' own connections
            kernel = split()
            return (len(fleet) == 2 and sum(fleet) == SEQS and fleet[1] >= SEQS // 2 - 3
                    and all(k >= f for k, f in zip(kernel, fleet, strict=True)) and sum(kernel) <= SEQS + 2)

        try:
            wait_until(even, 60, "the gateway's pool even over both API servers, as /fleet says")
        except AssertionError as e:
            raise AssertionError(f"{e}: {split()}, /fleet {httpx.get(gw + '/fleet', timeout=5).json()}") from None
        print(f"pool by API server {split()}")

        def ride(n: int, at_once: int) -> dict[int, int]:
            """Connections that carried ``n`` requests sent ``at_once`` at a time, by API server."""
            before = pool()
            with ThreadPoolExecutor(at_once) as ex:
                assert all(ex.map(lambda _: serves(), range(n)))
            after = pool()
            carried = [k for k, c in after.items() if c[2] > before.get(k, (0, 0, 0, 0))[2]]
            return {s: sum(1 for k in carried if after[k][0] == s) for s in servers}

        one = ride(24, 1)  # LIFO: one connection (and the health probes' own, which also carry bytes)
        both = ride(48, 8)  # the least busy API server first: both
        print(f"connections that carried requests, by API server: one at a time {one}, 8 at once {both}")
        assert sum(one.values()) <= 3, one
        assert min(both.values()) >= 2, both

        os.kill(servers[1], signal.SIGKILL)  # one API server: vLLM stops the rest, the instance restarts

        def restarted() -> list[dict[str, Any]]:
            return [c for c in up.instances(sup) if c["name"] == "a" and c["pid"] != a]

        wait_until(lambda: bool(restarted()), 90, "a respawned")
        assert not group_alive(a) and not any(pgid_of(p) == a for p in servers)  # the old group emptied first
        wait_until(serves, 300, "a serving again")
        assert restarted()[0]["restarts"] == 1
        assert len(_api_servers(restarted()[0]["pid"])) == 2

        stop_leaves_nothing(up, sup, reaper)
    finally:
        if up.proc.poll() is None:
            os.killpg(up.proc.pid, signal.SIGKILL)
            up.proc.wait()
