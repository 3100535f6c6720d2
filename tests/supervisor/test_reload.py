"""Live changes (issue 18): `vllm-fleet reload` and SIGHUP apply an edited fleet file to a running
`up` with the real gateway in front of fake vLLMs. Added instances start and are served, removed
ones drain and stop, changed ones restart one at a time, all under traffic with no failed request;
a bad file changes nothing and says why."""

from __future__ import annotations

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

from tests.supervisor.conftest import Reaper, fleet_doc, free_port, wait_until
from tests.supervisor.test_up import Up, write

pytestmark = pytest.mark.timeout(120)
CLI = [sys.executable, "-m", "vllm_fleet.cli"]


class Traffic:
    """Requests for ``model`` back to back from two threads until stopped; every status counted."""

    def __init__(self, gw: str, model: str, stream: bool) -> None:
        self.codes: list[int | str] = []
        self._stop = threading.Event()
        body = {"model": model, "max_tokens": 6, "stream": stream, "messages": [{"role": "user", "content": "x"}]}

        def run() -> None:
            while not self._stop.is_set():
                try:
                    with httpx.stream("POST", gw + "/v1/chat/completions", json=body, timeout=30) as r:
                        text = r.read().decode()
                        ok = r.status_code == 200 and (not stream or text.rstrip().endswith("[DONE]"))
                        self.codes.append(200 if ok else f"{r.status_code} {text[-120:]}")
                except httpx.HTTPError as e:
                    self.codes.append(repr(e))

        self._threads = [threading.Thread(target=run) for _ in range(2)]
        for t in self._threads:
            t.start()

    def stop(self) -> list[int | str]:
        self._stop.set()
        for t in self._threads:
            t.join(30)
        return self.codes


def start(tmp_path: Path, reaper: Reaper, up_procs: list[Up], instances: list[dict[str, Any]]
          ) -> tuple[Up, dict[str, Any], str, str]:
    metrics = free_port()
    doc = fleet_doc(tmp_path, instances, metrics_port=metrics)
    del doc["gateway_command"]  # the real gateway
    up = Up([*CLI, "up", "-c", str(write(tmp_path, doc))], tmp_path, reaper, env={"FLEET_HEALTH_INTERVAL_S": "0.2"})
    up_procs.append(up)
    sup, gw = f"http://127.0.0.1:{metrics}", f"http://127.0.0.1:{doc['gateway']['port']}"
    up.wait_running(sup)
    wait_until(lambda: httpx.get(gw + "/ready").status_code == 200, 15, "gateway ready")
    return up, doc, sup, gw


def states(up: Up, sup: str) -> dict[str, str]:
    return {i["name"]: i["state"] for i in up.instances(sup)}


def reload(tmp_path: Path, doc: dict[str, Any], *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "reload", "-c", str(write(tmp_path, doc)), *flags], capture_output=True, text=True,
                          timeout=90)


def test_add_and_remove_under_streaming_traffic(tmp_path: Path, reaper: Reaper, up_procs: list[Up]) -> None:
    up, doc, sup, gw = start(tmp_path, reaper, up_procs, [
        {"name": "a", "model": "ma", "vllm_args": ["--fake-token-delay", "0.05"]}, {"name": "b", "model": "mb"}])
    traffic = Traffic(gw, "ma", stream=True)
    wait_until(lambda: len(traffic.codes) >= 4, 10, "streams on a")
    b_pid = next(i["pid"] for i in up.instances(sup) if i["name"] == "b")
    doc["instances"] = [doc["instances"][0], {**doc["instances"][1], "name": "c", "model": "mc", "port": free_port()}]
    done = reload(tmp_path, doc, "--wait", "30")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "added: c" in done.stdout and "removed: b" in done.stdout and "unchanged: a" in done.stdout
    assert states(up, sup) == {"a": "RUNNING", "c": "RUNNING", "gateway": "RUNNING"}
    wait_until(lambda: httpx.post(gw + "/v1/chat/completions", json={"model": "mc", "messages": []}).status_code
               == 200, 15, "c served through the gateway")
    time.sleep(1)
    codes = traffic.stop()
    assert codes and set(codes) == {200}, [c for c in codes if c != 200][:5]
    models = [m["id"] for m in httpx.get(gw + "/v1/models").json()["data"]]
    assert models == ["ma", "mc"]
    gone = httpx.post(gw + "/v1/chat/completions", json={"model": "mb", "messages": []})
    assert gone.status_code == 404 and "mc" in gone.json()["error"]["message"]
    assert b_pid not in [p for p in reaper.alive()], "b's process group was not stopped"
    out = up.output()
    assert "b: RUNNING -> DRAINING" in out and "b: removed from the fleet" in out


def test_changed_replicas_restart_one_at_a_time(tmp_path: Path, reaper: Reaper, up_procs: list[Up]) -> None:
    up, doc, sup, gw = start(tmp_path, reaper, up_procs, [
        {"name": "r1", "model": "m"}, {"name": "r2", "model": "m"}])
    traffic = Traffic(gw, "m", stream=False)
    wait_until(lambda: len(traffic.codes) >= 4, 10, "traffic on m")
    for inst in doc["instances"]:
        inst["vllm_args"] = ["--fake-latency", "0.01"]  # a changed command line
    done = reload(tmp_path, doc, "--wait", "60")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "changed: r1, r2" in done.stdout
    wait_until(lambda: "reload done" in up.output(), 30, "the reload to finish")
    codes = traffic.stop()
    assert set(codes) == {200}, [c for c in codes if c != 200][:5]
    out = up.output()
    # One at a time: r1 served again before r2 began to drain.
    assert out.index("r1: STARTING -> RUNNING", out.index("r1: RUNNING -> DRAINING")) < \
        out.index("r2: RUNNING -> DRAINING")
    for inst in up.instances(sup):  # the new command line is what runs now
        if inst["name"] != "gateway":
            assert b"--fake-latency" in Path(f"/proc/{inst['pid']}/cmdline").read_bytes(), inst


def test_a_bad_file_changes_nothing_and_says_why(tmp_path: Path, reaper: Reaper, up_procs: list[Up]) -> None:
    up, doc, sup, _ = start(tmp_path, reaper, up_procs, [{"name": "a", "model": "ma"}])
    before = up.instances(sup)
    bad = {**doc, "instances": [{**doc["instances"][0], "gpus_per_node": 2}]}
    done = reload(tmp_path, bad)
    assert done.returncode == 2 and "instances[0].gpus_per_node" in done.stderr, done.stderr
    # The same file by SIGHUP: `up` logs why and changes nothing.
    up.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "reload refused, nothing changed" in up.output(), 10, "the refusal in up's log")
    assert "gpus_per_node" in up.output().split("reload refused, nothing changed")[1][:500]
    # A port that the host has taken: refused by the running fleet, exit 2.
    with __import__("socket").socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        clash = {**doc, "instances": [doc["instances"][0], {"name": "z", "model": "mz", "device": "cpu",
                                                            "port": port}]}
        done = reload(tmp_path, clash)
        assert done.returncode == 2 and f"port {port}" in done.stderr, done.stdout + done.stderr
    after = up.instances(sup)
    assert [(i["name"], i["pid"], i["state"]) for i in after] == [(i["name"], i["pid"], i["state"]) for i in before]
    # SIGHUP with a good file applies it.
    write(tmp_path, {**doc, "instances": [*doc["instances"], {"name": "b", "model": "mb", "device": "cpu",
                                                              "port": free_port()}]})
    up.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: states(up, sup).get("b") == "RUNNING", 20, "b added by SIGHUP")
    assert yaml.safe_load((tmp_path / "fleet.yaml").read_text())["instances"][1]["name"] == "b"
