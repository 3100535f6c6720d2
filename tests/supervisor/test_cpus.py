"""gateway.cpus: the placement rules, the errors that name the key, and real children on their CPUs."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from fleet_supervisor.cpus import physical_cores, place, problems, span
from fleetspec.fleetfile import parse_fleet
from tests.supervisor.conftest import Reaper, fleet_doc, free_port, wait_until
from tests.supervisor.test_reload import reload
from tests.supervisor.test_up import Up, write
from tests.supervisor.test_validation import FOUR_GPUS, cuda, run_check

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def four_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fleet_supervisor.commands.discover_gpus", lambda: list(FOUR_GPUS))

EIGHT = [[c] for c in range(8)]  # a VM's vCPUs: no hyperthread siblings
ALL_EIGHT = frozenset(range(8))


def fleet(cpus: Any = "auto", workers: int = 1, device: str = "cuda") -> Any:
    inst = cuda("a", [0]) if device == "cuda" else {"name": "a", "model": "m", "device": "cpu"}
    return parse_fleet({"gateway": {"cpus": cpus, "workers": workers}, "instances": [inst]})


def test_auto_gives_the_gateway_the_last_core_and_vllm_the_rest() -> None:
    p = place(fleet(), ALL_EIGHT, EIGHT)
    assert p.gateway == {7} and p.instances == set(range(7))
    assert p.describe() == "gateway on 7, instances on 0-6 (auto: 1 of 8 physical cores for 1 gateway worker(s))"


def test_auto_keeps_hyperthread_siblings_together() -> None:
    cores = [[c, c + 4] for c in range(4)]
    p = place(fleet(), frozenset(range(8)), cores)
    assert p.gateway == {3, 7} and p.instances == {0, 1, 2, 4, 5, 6}


@pytest.mark.parametrize(("f", "cores", "why"), [
    (fleet(workers=3), EIGHT, "auto: 3 gateway worker(s) would take more than 1/4 of the 8 physical cores"),
    (fleet(), [[0], [1]], "auto: 1 gateway worker(s) would take more than 1/4 of the 2 physical cores"),
    (fleet(device="cpu"), EIGHT, "auto: a device: cpu instance places its own threads"),
    (fleet(cpus="all"), EIGHT, "gateway.cpus: all"),
])
def test_when_auto_or_all_leaves_every_cpu_to_everyone(f: Any, cores: list[list[int]], why: str) -> None:
    p = place(f, frozenset(c for g in cores for c in g), cores)
    assert (p.gateway, p.instances) == (None, None)
    assert p.describe() == f"not placed ({why})"


def test_a_list_is_used_as_given_even_with_cpu_instances() -> None:
    p = place(fleet(cpus=[2, 3], device="cpu"), ALL_EIGHT, EIGHT)
    assert p.gateway == {2, 3} and p.instances == {0, 1, 4, 5, 6, 7}
    assert span(p.instances) == "0-1,4-7"


@pytest.mark.parametrize(("cpus", "needle"), [
    ([], "gateway.cpus: the list is empty"),
    ([1, 1], "gateway.cpus: lists a CPU twice"),
    ([9, 40], "gateway.cpus: CPU 9, 40 is not one this process may use (CPUs this process may use: 0-7)"),
    (list(range(8)), "gateway.cpus: takes every CPU"),
])
def test_a_list_that_does_not_fit_is_named(cpus: list[int], needle: str) -> None:
    f = fleet(cpus=cpus)
    assert any(needle in m for m in problems(f, ALL_EIGHT)), problems(f, ALL_EIGHT)
    assert place(f, ALL_EIGHT, EIGHT).gateway is None


def test_physical_cores_reads_the_sibling_lists(tmp_path: Path) -> None:
    for cpu, siblings in ((0, "0,2"), (1, "1,3"), (2, "0,2"), (3, "1,3")):
        d = tmp_path / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "thread_siblings_list").write_text(siblings + "\n")
    assert physical_cores(frozenset(range(4)), tmp_path) == [[0, 2], [1, 3]]
    # A CPU outside this process's set is not counted; one without sysfs is a core of its own.
    assert physical_cores(frozenset({0, 1, 5}), tmp_path) == [[0], [1], [5]]


def test_check_exits_2_naming_gateway_cpus(tmp_path: Path, four_gpus: None, capsys: pytest.CaptureFixture[str]) -> None:
    doc = fleet_doc(tmp_path, [cuda("a", [0])])
    doc["gateway"]["cpus"] = [100000]
    code, _, err = run_check(tmp_path, doc, capsys)
    assert code == 2
    assert "gateway.cpus: CPU 100000 is not one this process may use" in err


def test_check_says_the_placement(tmp_path: Path, four_gpus: None, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_check(tmp_path, fleet_doc(tmp_path, [cuda("a", [0])]), capsys)
    assert code == 0, err
    assert "  cpus:    " in out and "auto:" in out


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="placing needs two CPUs to tell them apart")
def test_up_runs_the_gateway_and_every_instance_process_on_their_cpus_and_a_reload_keeps_them(
        tmp_path: Path, reaper: Reaper, up_procs: list[Up]) -> None:
    allowed = frozenset(os.sched_getaffinity(0))
    gateway_cpu = max(allowed)
    metrics = free_port()
    doc = fleet_doc(tmp_path, [{"name": "a", "model": "m-a", "vllm_args": ["--fake-workers", "2"]}],
                    metrics_port=metrics)
    doc["gateway"]["cpus"] = [gateway_cpu]
    up = Up([sys.executable, "-m", "vllm_fleet.cli", "up", "-c", str(write(tmp_path, doc))], tmp_path, reaper)
    up_procs.append(up)
    children = {c["name"]: c["pid"] for c in up.wait_running(f"http://127.0.0.1:{metrics}")}
    wait_until(lambda: len(reaper.alive()) == 1 + 2 + 2, 10, "up, two children, two workers")
    rest = allowed - {gateway_cpu}
    assert os.sched_getaffinity(children["gateway"]) == {gateway_cpu}
    workers = [p for p in reaper.alive() if p not in (up.proc.pid, *children.values())]
    for pid in (children["a"], *workers):  # the forked workers inherit their parent's CPUs
        assert os.sched_getaffinity(pid) == rest, pid
    assert os.sched_getaffinity(up.proc.pid) == allowed, "up itself stays where it was started"
    assert f"CPUs: gateway on {gateway_cpu}, instances on {span(rest)} (gateway.cpus)" in up.output()

    # A reload restarts a changed instance; the gateway keeps its CPUs until the next `up`, so the
    # new instance keeps the rest rather than taking the gateway's.
    doc["gateway"]["cpus"] = "all"
    doc["instances"][0]["vllm_args"] = ["--fake-workers", "1"]
    done = reload(tmp_path, doc, "--wait", "30")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gateway: changed in the file; it applies at the next start" in done.stdout
    after = {c["name"]: c["pid"] for c in up.instances(f"http://127.0.0.1:{metrics}")}
    assert after["a"] != children["a"] and after["gateway"] == children["gateway"]
    assert os.sched_getaffinity(after["a"]) == rest
