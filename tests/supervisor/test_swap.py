"""More models than memory (docs/sleep.md), end to end: `vllm-fleet up` with the real gateway in front
of fake vLLMs that sleep as vLLM does (while asleep /health is 200 and requests hang), two instances
whose shares of one device let only one be awake. Every test also checks that no request ever
reached a sleeping server (the fake counts them)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.supervisor.conftest import Reaper, fleet_doc, free_port, wait_until
from tests.supervisor.test_up import Up, write

pytestmark = pytest.mark.timeout(120)


@dataclass
class Swap:
    up: Up
    gw: str
    sup: str
    ports: dict[str, int]

    def states(self) -> dict[str, str]:
        return {i["name"]: i["state"] for i in self.up.instances(self.sup)}

    def stats(self, name: str) -> dict[str, int]:
        return dict(httpx.get(f"http://127.0.0.1:{self.ports[name]}/_fake/stats", timeout=5).json())

    def configure(self, name: str, **knobs: Any) -> None:
        httpx.post(f"http://127.0.0.1:{self.ports[name]}/_fake/config", json=knobs, timeout=5).raise_for_status()

    def chat(self, model: str, timeout: float = 60, **extra: Any) -> httpx.Response:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, **extra}
        return httpx.post(f"{self.gw}/v1/chat/completions", json=body, timeout=timeout)

    def metrics(self) -> str:
        return httpx.get(f"{self.sup}/metrics", timeout=5).text

    def never_asleep_hit(self) -> None:
        for name in self.ports:
            assert self.stats(name)["while_asleep"] == 0, f"a request reached {name} while it slept"


def start(tmp_path: Path, reaper: Reaper, up_procs: list[Up], a: dict[str, Any] | None = None,
          b: dict[str, Any] | None = None, env: dict[str, str] | None = None, hold_s: float = 2.0,
          **supervisor: Any) -> Swap:
    metrics = free_port()
    sleep_a = {"mode": "vllm", "share": 0.6, **(a or {})}
    sleep_b = {"mode": "vllm", "share": 0.6, "preload": True, **(b or {})}
    doc = fleet_doc(tmp_path, [{"name": "a", "model": "ma", "sleep": sleep_a},
                               {"name": "b", "model": "mb", "sleep": sleep_b}], metrics_port=metrics, **supervisor)
    del doc["gateway_command"]  # the real gateway
    doc["swap"] = {"hold_s": hold_s}
    ports = {i["name"]: i["port"] for i in doc["instances"]}
    up = Up([sys.executable, "-m", "vllm_fleet.cli", "up", "-c", str(write(tmp_path, doc))], tmp_path, reaper,
            env={"FLEET_HEALTH_INTERVAL_S": "0.2", **(env or {})})
    up_procs.append(up)
    s = Swap(up, f"http://127.0.0.1:{doc['gateway']['port']}", f"http://127.0.0.1:{metrics}", ports)
    want = {"a": "RUNNING" if sleep_a.get("preload") else "SLEEPING", "b": "RUNNING", "gateway": "RUNNING"}
    wait_until(lambda: s.states() == want, 30, f"start-up states {want} (got {s.states()})")
    wait_until(lambda: _served(s, "mb"), 15, "b in rotation at the gateway")
    return s


def _served(s: Swap, model: str) -> bool:
    try:
        models = httpx.get(f"{s.gw}/v1/models", timeout=2).json()["data"]
    except (httpx.HTTPError, KeyError, ValueError):
        return False
    return any(m["id"] == model and m["state"] == "awake" for m in models)


def test_startup_puts_the_unpreloaded_to_sleep_and_lists_both(tmp_path: Path, reaper: Reaper,
                                                              up_procs: list[Up]) -> None:
    s = start(tmp_path, reaper, up_procs)
    out = s.up.output()
    # One load at a time on the shared device: a was ready and asleep before b started loading.
    assert out.index("a: DRAINING -> SLEEPING") < out.index("b: STOPPED -> STARTING")
    models = {m["id"]: m["state"] for m in httpx.get(f"{s.gw}/v1/models").json()["data"]}
    assert models == {"ma": "asleep", "mb": "awake"}
    fleet = {b["name"]: b for b in httpx.get(f"{s.gw}/fleet").json()["backends"]}
    assert fleet["a"]["state"] == "asleep" and fleet["a"]["supervisor_state"] == "SLEEPING"
    assert httpx.get(f"{s.gw}/ready").status_code == 200  # a sleeping model is servable
    text = s.metrics()
    assert 'fleet_instance_sleeping{instance="a"} 1.0' in text and 'fleet_instance_sleeping{instance="b"} 0.0' in text
    assert 'fleet_swaps_total{reason="startup"} 1.0' in text


def test_a_request_wakes_its_model_and_puts_the_idle_one_to_sleep(tmp_path: Path, reaper: Reaper,
                                                                  up_procs: list[Up]) -> None:
    s = start(tmp_path, reaper, up_procs)
    r = s.chat("ma")
    assert r.status_code == 200 and r.headers["x-fleet-backend"] == "a"
    assert s.states() == {"a": "RUNNING", "b": "SLEEPING", "gateway": "RUNNING"}
    r = s.chat("mb")  # and back
    assert r.status_code == 200 and r.headers["x-fleet-backend"] == "b"
    assert s.states() == {"a": "SLEEPING", "b": "RUNNING", "gateway": "RUNNING"}
    s.never_asleep_hit()
    text = s.metrics()
    assert 'fleet_swaps_total{reason="swap"} 2.0' in text
    assert 'fleet_wake_seconds_count{instance="a",mode="vllm"} 1.0' in text
    assert s.stats("a")["wakes"] == 1 and s.stats("b")["sleeps"] == 1


def test_no_sleep_while_a_request_is_in_flight(tmp_path: Path, reaper: Reaper, up_procs: list[Up]) -> None:
    s = start(tmp_path, reaper, up_procs, hold_s=0.0)
    s.configure("b", token_delay=0.1)
    done: dict[str, Any] = {}

    def long_stream() -> None:
        with httpx.stream("POST", f"{s.gw}/v1/chat/completions", timeout=60, json={
                "model": "mb", "stream": True, "max_tokens": 30, "messages": [{"role": "user", "content": "x"}]}) as r:
            done["body"] = r.read().decode()
            done["at"] = time.monotonic()

    t = threading.Thread(target=long_stream)
    t.start()
    wait_until(lambda: s.stats("b")["in_flight"] == 1, 10, "b streaming")
    r = s.chat("ma")  # needs b's memory; b has a 3 s stream in flight
    served_at = time.monotonic()
    t.join(30)
    assert r.status_code == 200
    assert done["body"].rstrip().endswith("data: [DONE]"), "the stream on b was cut"
    assert done["at"] <= served_at, "a was woken before b's stream ended"
    assert s.stats("b")["cancelled"] == 0
    s.never_asleep_hit()


def test_a_busy_model_yields_after_hold_s(tmp_path: Path, reaper: Reaper, up_procs: list[Up]) -> None:
    """Back-to-back requests for b never leave it idle; a still gets its turn, once b has held the
    memory hold_s since a's requests began to wait (no starvation), and b is not cut."""
    s = start(tmp_path, reaper, up_procs, hold_s=1.5)
    s.configure("b", latency=0.2)
    stop = threading.Event()
    codes: list[int] = []

    def hammer() -> None:
        while not stop.is_set():
            codes.append(s.chat("mb").status_code)

    threads = [threading.Thread(target=hammer) for _ in range(2)]
    for t in threads:
        t.start()
    wait_until(lambda: len(codes) >= 4, 10, "b busy")
    t0 = time.monotonic()
    r = s.chat("ma")
    waited = time.monotonic() - t0
    stop.set()
    for t in threads:
        t.join(60)
    assert r.status_code == 200
    assert 1.4 <= waited <= 10, f"a waited {waited:.2f}s; hold_s is 1.5"
    assert set(codes) == {200}, "b's requests that arrived during the swap waited for it, none failed"
    s.never_asleep_hit()


def test_a_client_that_leaves_the_queue_is_not_served(tmp_path: Path, reaper: Reaper, up_procs: list[Up]) -> None:
    s = start(tmp_path, reaper, up_procs)
    s.configure("a", wake_delay=2.0)
    with pytest.raises(httpx.ReadTimeout):
        s.chat("ma", timeout=0.5)
    gateway_metrics: Callable[[], str] = lambda: httpx.get(f"{s.gw}/metrics").text  # noqa: E731
    wait_until(lambda: 'fleet_queue_depth{model="ma"} 0.0' in gateway_metrics(), 5, "the queue emptied")
    wait_until(lambda: s.states()["a"] == "RUNNING", 10, "a woken all the same")
    time.sleep(0.5)
    assert s.stats("a")["requests_total"] == 0, "the request of a client that left reached the backend"


def test_a_failed_wake_restarts_cold_and_the_waiter_is_served(tmp_path: Path, reaper: Reaper,
                                                              up_procs: list[Up]) -> None:
    s = start(tmp_path, reaper, up_procs)
    s.configure("a", wake_fail=True)
    r = s.chat("ma", timeout=60)
    assert r.status_code == 200
    out = s.up.output()
    assert "wake failed" in out and "a: WAKING -> EXITED" in out and "a: BACKOFF -> STARTING" in out
    s.never_asleep_hit()


def test_a_waiter_gets_503_only_when_its_wait_passes(tmp_path: Path, reaper: Reaper, up_procs: list[Up]) -> None:
    s = start(tmp_path, reaper, up_procs, env={"FLEET_WAKE_TIMEOUT_S": "1"})
    s.configure("a", wake_delay=4.0)
    t0 = time.monotonic()
    r = s.chat("ma")
    assert r.status_code == 503 and r.json()["error"]["code"] == "no_healthy_backend"
    assert int(r.headers["retry-after"]) >= 1 and time.monotonic() - t0 >= 0.9
    wait_until(lambda: s.states()["a"] == "RUNNING", 10, "the wake finished anyway")
    assert s.chat("ma").status_code == 200


def test_idle_time_counts_from_the_last_request(tmp_path: Path, reaper: Reaper, up_procs: list[Up]) -> None:
    s = start(tmp_path, reaper, up_procs, b={"idle_s": 1.5})
    t_end = time.monotonic() + 3
    while time.monotonic() < t_end:  # busy for 3 s, twice the idle time
        last = time.monotonic()  # before the request: the gateway stamps it later, when it routes it
        assert s.chat("mb").status_code == 200
        time.sleep(0.3)
    assert s.states()["b"] == "RUNNING"
    wait_until(lambda: s.states()["b"] == "SLEEPING", 10, "b asleep once idle")
    # Counted from the last request, not the first: asleep at least the idle time after the last
    # one was sent (measured after it answered, a slow answer on a loaded machine ate the margin).
    assert time.monotonic() - last >= 1.2
    assert 'fleet_swaps_total{reason="idle"} 1.0' in s.metrics()


def test_admin_sleep_and_wake_need_the_admin_key(tmp_path: Path, reaper: Reaper, up_procs: list[Up]) -> None:
    s = start(tmp_path, reaper, up_procs)
    key = (tmp_path / "state" / "admin.key").read_text().strip()
    url = f"{s.gw}/admin/instances/b/sleep"
    assert httpx.post(url).status_code == 401
    assert httpx.post(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
    r = httpx.post(url, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    wait_until(lambda: s.states()["b"] == "SLEEPING", 10, "b asleep")
    cli = [sys.executable, "-m", "vllm_fleet.cli"]
    import subprocess

    done = subprocess.run([*cli, "wake", "b", "--url", s.gw, "--state-dir", str(tmp_path / "state")],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    wait_until(lambda: s.states()["b"] == "RUNNING", 10, "b awake")
    missing = httpx.post(f"{s.gw}/admin/instances/nope/sleep", headers={"Authorization": f"Bearer {key}"})
    assert missing.status_code == 404 and "no instance named 'nope'" in missing.json()["error"]["message"]
    assert 'fleet_swaps_total{reason="admin"} 1.0' in s.metrics()
    s.never_asleep_hit()


def test_a_drain_waits_for_a_busy_engine_but_not_for_gauges_nothing_moves(tmp_path: Path, reaper: Reaper,
                                                                          up_procs: list[Up]) -> None:
    """vLLM with two API servers left num_requests_running up after cut streams, its token counters
    flat, until its next request (bench/gpu/results/cut-gauges-h200); a draining instance gets none.
    Busy gauges whose counters move hold the drain; flat ones for drain_stalled_s do not."""
    s = start(tmp_path, reaper, up_procs, drain_stalled_s=1.5)
    key = (tmp_path / "state" / "admin.key").read_text().strip()
    s.configure("b", load_running=5, load_tokens=100, load_tokens_step=10)  # another client's work, running
    r = httpx.post(f"{s.gw}/admin/instances/b/sleep", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    wait_until(lambda: s.states()["b"] == "DRAINING", 10, "b draining")
    time.sleep(3.0)  # twice drain_stalled_s: moving counters keep it draining
    assert s.states()["b"] == "DRAINING"
    began = time.monotonic()
    s.configure("b", load_tokens_step=0)  # the same 5, nothing moving: vLLM's stuck gauges
    wait_until(lambda: s.states()["b"] == "SLEEPING", 10, "b asleep")
    assert time.monotonic() - began >= 1.4
    assert "drained: vLLM's /metrics still says 5 running or waiting, but no token has moved for 1.5 s" in s.up.output()
    s.never_asleep_hit()


def test_cold_mode_starts_on_the_first_request(tmp_path: Path, reaper: Reaper, up_procs: list[Up]) -> None:
    s = start(tmp_path, reaper, up_procs, a={"mode": "cold"}, b={"mode": "cold"})
    assert "a: STOPPED -> SLEEPING" in s.up.output() and "a: STOPPED -> STARTING" not in s.up.output()
    r = s.chat("ma")
    assert r.status_code == 200 and r.headers["x-fleet-backend"] == "a"
    assert s.states() == {"a": "RUNNING", "b": "SLEEPING", "gateway": "RUNNING"}
    assert "b: DRAINING -> SLEEPING" in s.up.output()
    assert 'fleet_wake_seconds_count{instance="a",mode="cold"} 1.0' in s.metrics()


def test_memory_operations_on_one_device_never_overlap(tmp_path: Path, reaper: Reaper, up_procs: list[Up]) -> None:
    """Seen on H200: vLLM's sleep asserts that the device's free memory grew, so another instance
    waking meanwhile killed the sleeper's engine. Here each fake holds a shared marker while it
    starts, sleeps or wakes, and dies as vLLM did if it finds the marker taken: three models, two
    fit awake, requests for all three at once, again and again."""
    metrics = free_port()
    marker = str(tmp_path / "gpu0.busy")
    flags = ["--fake-memory-file", marker, "--fake-startup-delay", "0.3", "--fake-sleep-delay", "0.2",
             "--fake-wake-delay", "0.2"]
    doc = fleet_doc(tmp_path, [{"name": n, "model": f"m{n}", "vllm_args": flags,
                                "sleep": {"mode": "vllm", "share": 0.4, "preload": n == "x"}} for n in "xyz"],
                    # Probes patient enough that a loaded 2-core host never restarts a fake: a restart here
                    # must mean an engine died of an overlap.
                    metrics_port=metrics, health_timeout_s=5, health_failures=10)
    del doc["gateway_command"]
    doc["swap"] = {"hold_s": 0.5}
    up = Up([sys.executable, "-m", "vllm_fleet.cli", "up", "-c", str(write(tmp_path, doc))], tmp_path, reaper,
            env={"FLEET_HEALTH_INTERVAL_S": "0.2"})
    up_procs.append(up)
    s = Swap(up, f"http://127.0.0.1:{doc['gateway']['port']}", f"http://127.0.0.1:{metrics}",
             {i["name"]: i["port"] for i in doc["instances"]})
    wait_until(lambda: s.states() == {"x": "RUNNING", "y": "SLEEPING", "z": "SLEEPING", "gateway": "RUNNING"}, 30,
               "start-up: x preloaded, y and z asleep")
    codes: list[int] = []

    def ask(model: str) -> None:
        codes.append(s.chat(model).status_code)

    for _ in range(4):
        threads = [threading.Thread(target=ask, args=(m,)) for m in ("mx", "my", "mz")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert codes == [200] * 12, codes
    text = s.metrics()
    for n in "xyz":
        assert f'fleet_instance_restarts_total{{instance="{n}"}} 0.0' in text, s.up.output()[-3000:]
    assert "Memory usage increased" not in s.up.output()
    s.never_asleep_hit()
