"""The workers' shared in-flight table (gateway/shared.py), two views of one file in one process."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetspec.tiers import VramTier
from gateway.backend import Backend, BackendSet
from gateway.limiter import MAX_IN_FLIGHT, Limiter, Rejected
from gateway.metrics import GatewayMetrics
from gateway.pool import BackendPool
from gateway.settings import GatewaySettings
from gateway.shared import GATEWAY, SharedCounts, create
from gateway.state import BackendState


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_each_view_writes_its_row_and_reads_every_row(tmp_path: Path) -> None:
    path = create(str(tmp_path), 2)
    a, b = SharedCounts(path, 2, pid=os.getppid()), SharedCounts(path, 2)  # two live processes' rows
    try:
        assert {a.row, b.row} == {0, 1}
        # A backend name gets one column, whichever view asks first.
        col = a.column("fake-1")
        assert col is not None and col != GATEWAY and b.column("fake-1") == col
        assert b.column("fake-2") not in (None, col)
        a.set(col, 3)
        b.set(col, 4)
        b.set(GATEWAY, 5)
        assert a.total(col) == b.total(col) == 7
        assert a.total(GATEWAY) == 5
        a.set(col, 0)
        assert b.total(col) == 4
    finally:
        b.close()
        a.close()


def test_a_dead_workers_row_is_taken_over_and_zeroed(tmp_path: Path) -> None:
    path = create(str(tmp_path), 1)
    crashed = SharedCounts(path, 1, pid=dead_pid())
    col = crashed.column("fake-1")
    assert col is not None
    crashed.set(col, 9)  # requests that died with their worker
    replacement = SharedCounts(path, 1)
    try:
        assert replacement.row == crashed.row
        assert replacement.total(col) == 0
    finally:
        replacement.close()


def test_no_row_for_a_worker_beyond_the_table(tmp_path: Path) -> None:
    path = create(str(tmp_path), 1)
    mine = SharedCounts(path, 1)
    try:
        with pytest.raises(RuntimeError, match="worker rows"):
            SharedCounts(path, 1)
    finally:
        mine.close()


def test_a_name_too_long_has_no_column(tmp_path: Path) -> None:
    path = create(str(tmp_path), 1)
    v = SharedCounts(path, 1)
    try:
        assert v.column("x" * 200) is None
    finally:
        v.close()


def worker(shared: SharedCounts) -> tuple[Limiter, Backend]:
    """One worker's limiter over its own Backend object for the backend both see."""
    b = Backend("fake-1", "http://fake-1", VramTier.UNKNOWN, ["m"], ["m"])
    b.state = BackendState.HEALTHY
    settings = GatewaySettings(workers=2, backend_max_concurrency=2, max_in_flight=3, queue_timeout_s=5)
    return Limiter(BackendPool(BackendSet([b]), None), settings, GatewayMetrics(), shared), b


async def test_two_workers_limiters_share_a_backends_slots_and_the_gateway_cap(tmp_path: Path) -> None:
    path = create(str(tmp_path), 2)
    sa, sb = SharedCounts(path, 2, pid=os.getppid()), SharedCounts(path, 2)
    try:
        (la, a), (lb, b) = worker(sa), worker(sb)
        deadline = asyncio.get_running_loop().time() + 10
        # The whole limit (2), not half of it each: one worker may take both slots.
        assert await la.acquire("m", (), deadline) is a
        assert await la.acquire("m", (), deadline) is a
        waiter = asyncio.create_task(lb.acquire("m", (), deadline))
        await asyncio.sleep(0.05)
        assert not waiter.done() and lb.waiting == 1  # full across the workers: b's worker queues
        la.release(a)  # freed in the other worker: b's worker sees it at its next look
        assert await asyncio.wait_for(waiter, 1) is b
        assert (la.count(a), lb.count(b)) == (2, 2)

        for lim in (la, la, lb):
            lim.enter()
        with pytest.raises(Rejected) as cap:
            lb.enter()  # 3 in the gateway, its cap, though this worker holds only 1
        assert cap.value.reason == MAX_IN_FLIGHT
    finally:
        sb.close()
        sa.close()
