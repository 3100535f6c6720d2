"""Fixtures for supervisor tests: free ports, fleet files that run the fake vLLM, and a reaper.

Every process a test starts carries a per-test token in its environment (forked workers inherit
it). Teardown finds them through /proc and SIGKILLs their groups, so a failing test leaves
nothing behind and "no process remains" can be asserted without pkill.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.procs import free_port, live_pids

REPO = Path(__file__).resolve().parents[2]
FAKE_VLLM = str(REPO / "tests" / "fakes" / "fake_vllm.py")
TOKEN_VAR = "FLEET_TEST_TOKEN"


def pids_with_token(token: str) -> list[int]:
    """Live processes (not zombies) whose environment carries ``token``."""
    needle = f"{TOKEN_VAR}={token}".encode()
    found = []
    for pid in live_pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(pid)
    return found


def pgid_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_until(cond: Any, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class Reaper:
    def __init__(self) -> None:
        self.token = uuid.uuid4().hex
        self.pgids: set[int] = set()

    def env(self) -> dict[str, str]:
        return {TOKEN_VAR: self.token}

    def alive(self) -> list[int]:
        return pids_with_token(self.token)

    def kill_all(self) -> None:
        for pid in self.alive():
            pgid = pgid_of(pid)
            if pgid is not None and pgid != os.getpgrp():
                self.pgids.add(pgid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pgid in self.pgids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)

    def reap_adopted(self) -> None:
        """Reap members of our groups that this (subreaper) process adopted."""
        for pgid in self.pgids:
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(-pgid, os.WNOHANG)[0]:
                    pass


@pytest.fixture
def reaper() -> Iterator[Reaper]:
    r = Reaper()
    try:
        yield r
    finally:
        r.kill_all()


def fleet_doc(tmp_path: Path, instances: list[dict[str, Any]], **supervisor: Any) -> dict[str, Any]:
    """A fleet file that runs the fake vLLM, with short timings and everything under tmp_path."""
    sup: dict[str, Any] = {
        "startup_timeout_s": 10, "health_interval_s": 0.1, "health_timeout_s": 1, "health_failures": 2,
        "stop_grace_s": 2, "backoff_initial_s": 0.05, "backoff_max_s": 0.5, "start_retries": 3, "start_secs": 1,
        "log_dir": str(tmp_path / "logs"), "state_dir": str(tmp_path / "state"), "metrics_port": 0,
        "progress_interval_s": 1,
    }
    sup.update(supervisor)
    gw_port = free_port()
    return {
        "gateway": {"host": "127.0.0.1", "port": gw_port},
        "vllm_command": [sys.executable, FAKE_VLLM],
        # The fake vLLM serves /health, which is all the supervisor asks of a gateway.
        "gateway_command": [sys.executable, FAKE_VLLM, "--port", str(gw_port), "-c", "{config}"],
        "supervisor": sup,
        "instances": [{"device": "cpu", "port": free_port(), **inst} for inst in instances],
    }


@pytest.fixture
def up_procs() -> Iterator[list[Any]]:
    """`vllm-fleet up` processes a test starts (test_up.Up): killed with their group afterwards."""
    started: list[Any] = []
    try:
        yield started
    finally:
        for up in started:
            if up.proc.poll() is None:
                os.killpg(up.proc.pid, signal.SIGKILL)
                up.proc.wait()
