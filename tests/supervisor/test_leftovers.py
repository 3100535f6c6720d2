"""Issue 18 #3: ``up`` killed with SIGKILL. Its children get SIGTERM from the kernel; what outlives
that (workers, a child that ignores SIGTERM) is found through the state file by ``check`` (exit 2,
naming it) and stopped by the next ``up``, which then serves. Nothing that merely reuses a
recorded pid is touched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fleet_supervisor import procfs, runfile
from tests.supervisor.conftest import Reaper, fleet_doc, free_port, pgid_of, wait_until
from tests.supervisor.test_up import Up, write
from tests.support.procs import group_members, pid_alive

pytestmark = pytest.mark.timeout(120)


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    return subprocess.run([sys.executable, "-m", "vllm_fleet.cli", *args], capture_output=True, text=True,
                          timeout=60, env={**clean, **env})


def test_sigkilled_up_is_cleaned_up_by_the_next_up(tmp_path: Path, reaper: Reaper, up_procs: list[Up]) -> None:
    metrics = free_port()
    doc = fleet_doc(tmp_path, [
        # a: workers outlive their API server, as vLLM's EngineCore does after a SIGKILL.
        {"name": "a", "model": "m-a", "vllm_args": ["--fake-workers", "2"]},
        # b: an API server that ignores SIGTERM, so the kernel's signal does not end it either.
        {"name": "b", "model": "m-b", "vllm_args": ["--fake-ignore-sigterm", "--fake-workers", "1"]},
    ], metrics_port=metrics)
    path = str(write(tmp_path, doc))
    url = f"http://127.0.0.1:{metrics}"
    first = Up([sys.executable, "-m", "vllm_fleet.cli", "up", "-c", path], tmp_path, reaper)
    up_procs.append(first)
    children = {c["name"]: c["pid"] for c in first.wait_running(url)}
    wait_until(lambda: len(reaper.alive()) == 1 + 3 + 3, 10, "up + 3 children + 3 workers")
    old = {p: pgid_of(p) for p in reaper.alive() if p != first.proc.pid}
    old_groups = {g for g in old.values() if g is not None}
    assert old_groups == set(children.values())
    state = tmp_path / "state" / "processes.json"
    record = runfile.read(state)
    assert record is not None and {c.name: c.pid for c in record.children} == children
    wait_until(lambda: sum(len(c.members) for c in (runfile.read(state) or record).children) == 6, 10,
               "every group member recorded")

    os.kill(first.proc.pid, signal.SIGKILL)  # `up` alone, as the OOM killer would
    first.proc.wait(10)
    # The kernel SIGTERMs every direct child: a's API server and the gateway exit.
    wait_until(lambda: not pid_alive(children["a"]) and not pid_alive(children["gateway"]), 10,
               "the children that honour SIGTERM to exit with their parent")
    left = {p: g for p, g in old.items() if pid_alive(p)}
    assert children["b"] in left and len(left) == 4, left  # b's API server, 2 + 1 workers
    assert {g for g in left.values()} == {children["a"], children["b"]}

    checked = cli("check", "-c", path, env=reaper.env())
    assert checked.returncode == 2, checked.stdout + checked.stderr
    msg = checked.stderr
    print("\n" + msg)
    assert str(state) in msg and "run `vllm-fleet up` to stop them" in msg
    for name in ("a", "b"):
        inst = next(i for i in doc["instances"] if i["name"] == name)
        assert f"{name}: process group {children[name]}" in msg and f"port {inst['port']}" in msg
    assert all(str(p) in msg for p in left)
    assert left == {p: g for p, g in old.items() if pid_alive(p)}, "check signalled nothing"

    t0 = time.monotonic()
    second = Up([sys.executable, "-m", "vllm_fleet.cli", "up", "-c", path], tmp_path, reaper)
    up_procs.append(second)
    now = second.wait_running(url)
    print(f"\nsecond up: leftovers stopped and every child RUNNING in {time.monotonic() - t0:.1f}s")
    assert all(c["pid"] not in children.values() for c in now)
    for g in old_groups:
        assert group_members(g) == [], f"old process group {g} still has {group_members(g)}"
    out = second.output()
    assert "left processes running; stopping them" in out and f"process group {children['b']}" in out
    gw = f"http://127.0.0.1:{doc['gateway']['port']}/health"
    assert httpx.get(gw, timeout=5).status_code == 200

    second.proc.send_signal(signal.SIGTERM)
    assert second.proc.wait(30) == 0, second.output()
    assert reaper.alive() == [] and not state.exists()


def _record_for(tmp_path: Path, pid: int, start_time: int, cmdline: list[str]) -> None:
    """A state file saying that a dead `up` started ``pid`` (as leader of its own group)."""
    me = runfile.this_process()
    dead_up = runfile.Proc(pid=me.pid, start_time=me.start_time - 1, cmdline=me.cmdline)
    child = runfile.Child(name="a", pid=pid, pgid=pid, start_time=start_time, port=free_port(), argv=cmdline,
                          members=[runfile.Proc(pid=pid, start_time=start_time, cmdline=cmdline)])
    runfile.write(runfile.state_path(tmp_path / "state"),
                  runfile.RunRecord(fleet_file=str(tmp_path / "fleet.yaml"), boot_id=procfs.boot_id(),
                                    supervisor=dead_up, children=[child]))


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A process leading its own group that is not the fleet's, as one that reused a pid would."""
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_reused_pid_is_never_signalled(tmp_path: Path, reaper: Reaper, bystander: subprocess.Popen[bytes]) -> None:
    st = procfs.stat(bystander.pid)
    assert st is not None
    doc = fleet_doc(tmp_path, [{"name": "a", "model": "m"}])
    path = str(write(tmp_path, doc))
    # Same pid, other start time: the recorded process is gone and the pid was handed out again.
    _record_for(tmp_path, bystander.pid, st.start_time - 1, ["sleep", "600"])
    assert cli("check", "-c", path, env=reaper.env()).returncode == 0
    # Same pid and start time, other cmdline: not provably ours either; named, left alone, exit 2.
    _record_for(tmp_path, bystander.pid, st.start_time, ["python", "-m", "vllm"])
    for command in ("check", "up"):
        done = cli(command, "-c", path, env=reaper.env())
        assert done.returncode == 2, done.stdout + done.stderr
        assert "could not be verified" in done.stderr and f"process group {bystander.pid}" in done.stderr
    assert bystander.poll() is None and reaper.alive() == []


def test_check_and_up_refuse_while_the_recorded_up_runs(tmp_path: Path, reaper: Reaper) -> None:
    doc = fleet_doc(tmp_path, [{"name": "a", "model": "m"}])
    path = str(write(tmp_path, doc))
    me = runfile.this_process()  # this test process stands in for a live `up` of the fleet
    runfile.write(runfile.state_path(tmp_path / "state"),
                  runfile.RunRecord(fleet_file=path, boot_id=procfs.boot_id(), supervisor=me, children=[]))
    for command in ("check", "up"):
        done = cli(command, "-c", path, env=reaper.env())
        assert done.returncode == 2 and f"already running (`up` pid {me.pid}" in done.stderr, done.stderr
    assert reaper.alive() == []
