"""The lifecycle of one instance, with real fake-vLLM processes in this test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fleet_supervisor.command import instance_spec
from fleet_supervisor.instance import InstanceSupervisor
from fleet_supervisor.metrics import FleetMetrics
from fleet_supervisor.process import become_subreaper
from fleet_supervisor.state import State
from fleetspec.fleetfile import parse_fleet
from tests.supervisor.conftest import Reaper, fleet_doc, group_alive
from tests.support.procs import pid_alive

pytestmark = pytest.mark.timeout(60)


class Harness:
    def __init__(self, tmp_path: Path, reaper: Reaper, session: aiohttp.ClientSession) -> None:
        self.tmp_path, self.reaper, self.session = tmp_path, reaper, session
        self.running: list[tuple[InstanceSupervisor, asyncio.Event, asyncio.Task[None]]] = []

    def start(self, vllm_args: list[str], metrics: FleetMetrics | None = None, command: list[str] | None = None,
              **supervisor: Any) -> InstanceSupervisor:
        doc = fleet_doc(self.tmp_path, [{"name": "inst", "model": "m", "vllm_args": vllm_args}], **supervisor)
        if command is not None:
            doc["vllm_command"] = command
        fleet = parse_fleet(doc)
        spec = instance_spec(fleet, fleet.instances[0], base_env={**os.environ, **self.reaper.env()})
        sup = InstanceSupervisor(spec, fleet.supervisor, self.session, url=fleet.instances[0].url,
                                 metrics=metrics, console=io.StringIO())
        stop = asyncio.Event()
        self.running.append((sup, stop, asyncio.create_task(sup.run(stop))))
        return sup

    async def stop(self, sup: InstanceSupervisor) -> float:
        """Stop ``sup``; return how long the stop took."""
        for s, stop, task in self.running:
            if s is sup:
                t0 = time.monotonic()
                stop.set()
                await asyncio.wait_for(task, 20)
                return time.monotonic() - t0
        raise AssertionError("not started")

    async def close(self) -> None:
        for _, stop, task in self.running:
            stop.set()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(task, 20)


async def wait_for(cond: Callable[[], bool], limit_s: float, what: str) -> None:
    deadline = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {limit_s}s waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.fixture
async def harness(tmp_path: Path, reaper: Reaper) -> AsyncIterator[Harness]:
    # As in `vllm-fleet up`: orphaned workers are re-parented to us and reaped at once.
    become_subreaper(True)
    try:
        async with aiohttp.ClientSession() as session:
            h = Harness(tmp_path, reaper, session)
            try:
                yield h
            finally:
                await h.close()
    finally:
        reaper.kill_all()
        reaper.reap_adopted()
        become_subreaper(False)


async def test_starts_runs_and_stops_the_whole_group(harness: Harness, tmp_path: Path) -> None:
    sup = harness.start(["--fake-startup-delay", "0.3", "--fake-workers", "2"])
    await wait_for(lambda: sup.state is State.RUNNING, 15, "RUNNING")
    pgid = sup.pid
    # Its own process group, in our session (one scheduling group under autogroup: process.py)
    assert pgid is not None and os.getpgid(pgid) == pgid and os.getsid(pgid) == os.getsid(0)
    await wait_for(lambda: len(harness.reaper.alive()) == 3, 5, "API server + 2 workers")
    assert {os.getpgid(p) for p in harness.reaper.alive()} == {pgid}
    await harness.stop(sup)
    assert sup.state is State.STOPPED and sup.pid is None
    assert not group_alive(pgid)
    assert harness.reaper.alive() == []
    log = (tmp_path / "logs" / "inst.log").read_text()
    assert "fake vllm" in log and "CUDA_VISIBLE_DEVICES=" in log
    console = sup._console
    assert isinstance(console, io.StringIO) and "[inst] fake vllm" in console.getvalue()


async def test_sigkill_restarts_after_reaping_the_workers(harness: Harness) -> None:
    sup = harness.start(["--fake-workers", "2"])
    await wait_for(lambda: sup.state is State.RUNNING, 15, "RUNNING")
    old = sup.pid
    assert old is not None
    await wait_for(lambda: len(harness.reaper.alive()) == 3, 5, "API server + 2 workers")
    workers = [p for p in harness.reaper.alive() if p != old]
    at_restart: list[bool] = []
    sup.on_transition = lambda _old, new: at_restart.append(group_alive(old)) if new is State.STARTING else None

    t0 = time.monotonic()
    os.kill(old, signal.SIGKILL)  # the API server only: its workers survive it, as vLLM's do
    await wait_for(lambda: sup.state is State.RUNNING and sup.pid not in (None, old), 15, "restart")
    latency = time.monotonic() - t0
    print(f"\nrestart latency after SIGKILL (fake vLLM, backoff 0.05 s): {latency:.2f}s")
    assert at_restart == [False], "the old group must be empty before the restart"
    assert not any(map(pid_alive, workers))
    assert sup.restarts == 1 and "exited with code -9" in (sup.last_exit or "")
    await harness.stop(sup)


async def test_crash_loop_ends_in_fatal(harness: Harness) -> None:
    metrics = FleetMetrics(["inst"])
    sup = harness.start(["--fake-crash-after", "0.2"], metrics=metrics, start_retries=2, start_secs=5)
    states: list[State] = []
    sup.on_transition = lambda _old, new: states.append(new)
    await wait_for(lambda: sup.state is State.FATAL, 30, "FATAL")
    await asyncio.sleep(0.3)  # FATAL stays down
    assert sup.state is State.FATAL and sup.restarts == 2 and sup.rapid_failures == 3
    assert states.count(State.BACKOFF) == 2 and states[-2:] == [State.EXITED, State.FATAL]
    assert harness.reaper.alive() == []
    text = metrics.render().decode()
    assert 'fleet_instance_state{instance="inst",state="FATAL"} 1.0' in text
    assert 'fleet_instance_state{instance="inst",state="RUNNING"} 0.0' in text
    assert 'fleet_instance_restarts_total{instance="inst"} 2.0' in text
    await harness.stop(sup)
    assert sup.state is State.FATAL


async def test_never_healthy_is_restarted_after_the_startup_timeout(harness: Harness) -> None:
    sup = harness.start(["--fake-never-healthy"], startup_timeout_s=0.8)
    states: list[State] = []
    sup.on_transition = lambda _old, new: states.append(new)
    await wait_for(lambda: sup.restarts >= 1 and sup.state is State.STARTING, 15, "a restart")
    assert states[:4] == [State.STARTING, State.EXITED, State.BACKOFF, State.STARTING]
    assert "startup_timeout_s=0.8" in (sup.last_exit or "")
    await harness.stop(sup)
    assert harness.reaper.alive() == []


async def test_failed_probes_while_running_restart_it(harness: Harness) -> None:
    sup = harness.start([], health_failures=3)
    await wait_for(lambda: sup.state is State.RUNNING, 15, "RUNNING")
    old = sup.pid
    async with aiohttp.ClientSession() as http:
        await http.post(f"{sup.url}/_fake/config", json={"health_status": 503})
    await wait_for(lambda: sup.state is State.RUNNING and sup.pid != old, 15, "restart after failed probes")
    assert sup.last_exit == "3 health probes in a row failed" and sup.restarts == 1
    await harness.stop(sup)


async def test_sigterm_ignored_means_sigkill_after_grace(harness: Harness) -> None:
    sup = harness.start(["--fake-ignore-sigterm", "--fake-workers", "1"], stop_grace_s=0.6)
    await wait_for(lambda: sup.state is State.RUNNING, 15, "RUNNING")
    pgid = sup.pid
    assert pgid is not None
    took = await harness.stop(sup)
    assert 0.5 <= took < 10, took
    assert not group_alive(pgid) and harness.reaper.alive() == []
    assert sup.state is State.STOPPED


async def test_a_command_that_cannot_start_goes_fatal(harness: Harness) -> None:
    sup = harness.start([], command=["/nonexistent/vllm"], start_retries=1)
    await wait_for(lambda: sup.state is State.FATAL, 10, "FATAL")
    assert "cannot start '/nonexistent/vllm'" in (sup.last_exit or "")


async def test_leftovers_of_a_crashed_leader_get_the_short_grace(harness: Harness) -> None:
    """Issue 18 #2: after the API server died, a worker that ignores SIGTERM held the restart for
    the whole stop_grace_s (30 s). Leftovers of a dead leader get orphan_grace_s (default 3 s)."""
    sup = harness.start(["--fake-workers", "1", "--fake-workers-ignore-sigterm"], stop_grace_s=30)
    await wait_for(lambda: sup.state is State.RUNNING, 15, "RUNNING")
    old = sup.pid
    assert old is not None
    await wait_for(lambda: len(harness.reaper.alive()) == 2, 5, "API server + worker")
    worker = next(p for p in harness.reaper.alive() if p != old)
    began: list[float] = []
    sup.on_transition = lambda _old, new: began.append(time.monotonic()) if new is State.STARTING else None

    t0 = time.monotonic()
    os.kill(old, signal.SIGKILL)  # the API server crashes; its worker stays and ignores SIGTERM
    try:
        await wait_for(lambda: bool(began), 15, "the restart to begin (the old behaviour waited 30 s)")
        print(f"\ncrash -> restart began, worker ignoring SIGTERM, stop_grace_s=30: {began[0] - t0:.2f}s")
        assert not pid_alive(worker), "the worker was SIGKILLed before the restart"
        await wait_for(lambda: sup.state is State.RUNNING and sup.pid not in (None, old), 15, "RUNNING again")
    finally:
        sup.urgent.set()  # the new worker ignores SIGTERM too: no 30 s grace in teardown
        await harness.stop(sup)


async def test_a_requested_stop_keeps_the_full_grace(harness: Harness) -> None:
    """The short grace is only for leftovers of a leader that was already dead: a stop that was asked
    for gives the whole group stop_grace_s, even once the leader is gone."""
    sup = harness.start(["--fake-workers", "1", "--fake-workers-ignore-sigterm"], stop_grace_s=1.5,
                        orphan_grace_s=0.1)
    await wait_for(lambda: sup.state is State.RUNNING, 15, "RUNNING")
    pgid = sup.pid
    assert pgid is not None
    took = await harness.stop(sup)
    assert took >= 1.4, took
    assert not group_alive(pgid) and harness.reaper.alive() == []
