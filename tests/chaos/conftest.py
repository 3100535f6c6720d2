"""Two fake replicas of model 'm' behind a gateway, per test (faults leave processes dead or
stopped, so nothing is shared between tests). Everything listens on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.procs import FakeVllm, Gateway, instances

# Fast probes so that a dead or frozen replica leaves rotation within a second.
FAST = {"FLEET_HEALTH_INTERVAL_S": "0.2", "FLEET_HEALTH_TIMEOUT_S": "0.5", "FLEET_HEALTH_FAILURES": "2",
        "FLEET_HEALTH_SUCCESSES": "2", "FLEET_LOG_LEVEL": "warning"}

Pair = tuple[FakeVllm, FakeVllm, Gateway]


@pytest.fixture
def make_pair(tmp_path: Path) -> Iterator[Callable[..., Pair]]:
    """``make_pair(env={...}, flags=[...])``: start two replicas and a gateway; all stopped after
    the test (a SIGSTOPped replica is continued first, so that it can exit on SIGTERM)."""
    started: list[FakeVllm | Gateway] = []

    def make(env: dict[str, str] | None = None, flags: tuple[str, ...] = ()) -> Pair:
        a = FakeVllm(tmp_path, ["m"], *flags)
        started.append(a)
        b = FakeVllm(tmp_path, ["m"], *flags)
        started.append(b)
        gw = Gateway(tmp_path, instances(a, b), env={**FAST, **(env or {})})
        started.append(gw)
        return a, b, gw

    try:
        yield make
    finally:
        for p in reversed(started):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGCONT)
            p.stop(grace=2.0)
