"""The workers' shared in-flight table (gateway/shared.py), two views of one file in one process."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetspec.policies import Policy
from fleetspec.tiers import VramTier
from gateway.backend import Backend, BackendSet
from gateway.ejection import Ejector
from gateway.limiter import MAX_IN_FLIGHT, QUEUE_FULL, Limiter, Rejected
from gateway.metrics import GatewayMetrics
from gateway.pool import BackendPool
from gateway.routing import Router, hint_for
from gateway.settings import GatewaySettings
from gateway.shared import FAILURES, GATEWAY, OLDEST, QUEUED, SharedCounts, column_of, create, turn_counter
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


def worker(shared: SharedCounts, queue: int = 512) -> tuple[Limiter, Backend]:
    """One worker's limiter over its own Backend object for the backend both see."""
    b = Backend("fake-1", "http://fake-1", VramTier.UNKNOWN, ["m"], ["m"])
    b.state = BackendState.HEALTHY
    settings = GatewaySettings(workers=2, backend_max_concurrency=2, max_in_flight=3, queue_timeout_s=5,
                               backend_queue=queue)
    return Limiter(BackendPool(BackendSet([b]), None, shared=shared), settings, GatewayMetrics()), b


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
        assert (la.pool.count(a), lb.pool.count(b)) == (2, 2)

        for lim in (la, la, lb):
            lim.enter()
        with pytest.raises(Rejected) as cap:
            lb.enter()  # 3 in the gateway, its cap, though this worker holds only 1
        assert cap.value.reason == MAX_IN_FLIGHT
    finally:
        sb.close()
        sa.close()


async def test_the_queue_is_the_gateways_whichever_worker_holds_the_waiters(tmp_path: Path) -> None:
    """A queue of 3 places over 2 workers: one worker may hold all 3 waiters (a divided queue gave
    it 2), and a fourth waiter is turned away in the other worker, which holds none."""
    path = create(str(tmp_path), 2)
    sa, sb = SharedCounts(path, 2, pid=os.getppid()), SharedCounts(path, 2)
    try:
        (la, a), (lb, _) = worker(sa, queue=3), worker(sb, queue=3)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        for _ in range(2):
            assert await la.acquire("m", (), deadline) is a  # both slots
        waiters = [asyncio.create_task(la.acquire("m", (), deadline)) for _ in range(3)]
        await asyncio.sleep(0.05)
        assert la.waiting == 3 and sb.total(sb.column("m") or 0, QUEUED) == 3
        with pytest.raises(Rejected) as full:
            await lb.acquire("m", (), deadline)
        assert full.value.reason == QUEUE_FULL
        for _ in range(2):
            la.release(a)
        assert [await asyncio.wait_for(w, 1) for w in waiters[:2]] == [a, a]  # oldest first
        assert sb.total(sb.column("m") or 0, QUEUED) == 1
        waiters[2].cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiters[2]
        assert sb.total(sb.column("m") or 0, QUEUED) == 0 and lb.waiting == 0
    finally:
        sb.close()
        sa.close()


async def test_a_slot_freed_in_one_worker_goes_to_the_oldest_waiter_in_any_worker(tmp_path: Path) -> None:
    """First come, first served across workers: the worker that frees a slot leaves it to an older
    waiter in another worker rather than give it to its own newer one; with no older waiter
    elsewhere, its own gets it."""
    path = create(str(tmp_path), 2)
    sa, sb = SharedCounts(path, 2, pid=os.getppid()), SharedCounts(path, 2)
    try:
        (la, a), (lb, b) = worker(sa), worker(sb)
        deadline = asyncio.get_running_loop().time() + 10
        for _ in range(2):
            assert await lb.acquire("m", (), deadline) is b  # both slots, held in b's worker
        first = asyncio.create_task(la.acquire("m", (), deadline))
        await asyncio.sleep(0.01)
        second = asyncio.create_task(lb.acquire("m", (), deadline))
        await asyncio.sleep(0.01)
        assert la.waiting == 1 and lb.waiting == 1
        lb.release(b)
        assert lb.waiting == 1  # not handed to b's worker's own, newer waiter
        assert await asyncio.wait_for(first, 1) is a  # a's worker took it at its next look
        assert not second.done()
        lb.release(b)  # no older waiter anywhere now
        assert await asyncio.wait_for(second, 1) is b
    finally:
        sb.close()
        sa.close()


async def test_a_slot_left_for_an_older_waiter_is_taken_after_the_grace_if_nobody_comes(tmp_path: Path) -> None:
    """A worker that published an older waiter but never looks (stalled, or its waiter may not use
    this backend) holds the slot up for FIFO_GRACE_NS at most."""
    path = create(str(tmp_path), 2)
    sa, sb = SharedCounts(path, 2, pid=os.getppid()), SharedCounts(path, 2)
    try:
        (lb, b) = worker(sb)
        deadline = asyncio.get_running_loop().time() + 10
        for _ in range(2):
            assert await lb.acquire("m", (), deadline) is b
        col = sa.column("m")
        assert col is not None
        sa.set(col, time.monotonic_ns(), OLDEST)  # a waiter in a worker that never looks
        mine = asyncio.create_task(lb.acquire("m", (), deadline))
        await asyncio.sleep(0.01)
        lb.release(b)
        assert lb.waiting == 1  # left for the older waiter, for now
        assert await asyncio.wait_for(mine, 2) is b
    finally:
        sb.close()
        sa.close()


def routing_worker(shared: SharedCounts, policy: Policy) -> tuple[Limiter, dict[str, Backend]]:
    """One worker's limiter over its own Backend objects for two replicas, unlimited."""
    reps = {n: Backend(n, f"http://{n}", VramTier.UNKNOWN, ["m"], ["m"]) for n in ("r1", "r2")}
    for b in reps.values():
        b.state = BackendState.HEALTHY
    pool = BackendPool(BackendSet(reps.values()), None,
                       lambda m: Router(policy, 1.25, 1000, 3.0, turn=turn_counter(shared, m)), shared=shared)
    return Limiter(pool, GatewaySettings(workers=2), GatewayMetrics()), reps


@pytest.mark.parametrize("policy", [Policy.LEAST_IN_FLIGHT, Policy.LOAD_AWARE, Policy.PREFIX_AWARE])
async def test_workers_balance_the_gateways_requests_not_each_their_own(tmp_path: Path, policy: Policy) -> None:
    """Each worker picks by the requests the whole gateway has open: a worker with nothing in
    flight of its own sends its first request to the replica the other worker left idle. Counting
    only its own (a tie), every worker's first request went to the same replica."""
    path = create(str(tmp_path), 2)
    sa, sb = SharedCounts(path, 2, pid=os.getppid()), SharedCounts(path, 2)
    try:
        (la, a), (lb, b) = routing_worker(sa, policy), routing_worker(sb, policy)
        deadline = asyncio.get_running_loop().time() + 10
        hint = hint_for({"prompt": "a prompt no replica has seen"}, None)
        first = await la.acquire("m", (), deadline, hint)
        assert first is not None
        second = await lb.acquire("m", (), deadline, hint_for({"prompt": "another prompt"}, None))
        assert second is not None and second.name != first.name
        assert {n: la.pool.count(r) for n, r in a.items()} == {"r1": 1, "r2": 1}
        la.release(first)
        # r1 or r2 is now idle in the gateway; worker b, which holds one, sends there.
        third = await lb.acquire("m", (), deadline)
        assert third is not None and third.name == first.name
        assert {n: lb.pool.count(r) for n, r in b.items()} == {"r1": 1, "r2": 1}
    finally:
        sb.close()
        sa.close()


async def test_workers_go_round_the_replicas_as_one(tmp_path: Path) -> None:
    """round_robin with two workers: the gateway's turns alternate the replicas whichever worker
    takes each request. With a turn per worker, each worker's first request went to r1."""
    path = create(str(tmp_path), 2)
    sa, sb = SharedCounts(path, 2, pid=os.getppid()), SharedCounts(path, 2)
    try:
        (la, _), (lb, _) = routing_worker(sa, Policy.ROUND_ROBIN), routing_worker(sb, Policy.ROUND_ROBIN)
        deadline = asyncio.get_running_loop().time() + 10
        chosen = []
        for lim in (la, lb, lb, la, lb, la):
            b = await lim.acquire("m", (), deadline)
            assert b is not None
            chosen.append(b.name)
        assert chosen == ["r1", "r2"] * 3
    finally:
        sb.close()
        sa.close()


def ejector_worker(shared: SharedCounts) -> tuple[Ejector, Backend, Backend]:
    """One worker's ejector over its own Backend objects for the two replicas every worker sees."""
    sick, other = (Backend(n, f"http://{n}", VramTier.UNKNOWN, ["m"], ["m"]) for n in ("sick", "other"))
    for b in (sick, other):
        b.state = BackendState.HEALTHY
    settings = GatewaySettings(workers=2, eject_failures=3, eject_base_s=0.3)
    return Ejector(BackendSet([sick, other]), settings, GatewayMetrics(), shared), sick, other


def test_failures_in_a_row_are_the_gateways_and_an_ejection_reaches_every_worker(tmp_path: Path) -> None:
    path = create(str(tmp_path), 2)
    sa, sb = SharedCounts(path, 2, pid=os.getppid()), SharedCounts(path, 2)
    try:
        (ea, a_sick, _), (eb, b_sick, _) = ejector_worker(sa), ejector_worker(sb)
        ea.failure(a_sick, "reset")
        ea.failure(a_sick, "reset")
        assert a_sick.healthy  # 2 of 3
        eb.success(b_sick)  # a good answer in the other worker resets only that worker's count
        eb.failure(b_sick, "reset")  # the gateway's third failure in a row, the first in this worker
        assert b_sick.state is BackendState.EJECTED
        assert a_sick.healthy  # worker a has not looked yet
        ea.follow_once()
        assert a_sick.state is BackendState.EJECTED
        assert abs(a_sick.ejected_until - b_sick.ejected_until) < 0.01
        # Back through a probe: the worker's count starts over at 0 in the table too.
        a_sick.record_probe(True, None, failures=1, successes=1)
        assert a_sick.state is BackendState.EJECTED  # not before the ejection ends
        time.sleep(max(0.0, a_sick.ejected_until - time.time()) + 0.01)
        a_sick.record_probe(True, None, failures=1, successes=1)
        assert a_sick.healthy and sa.total(column_of(sa, a_sick) or 0, FAILURES) == 1  # b's one remains
        ea.follow_once()  # the ejection's end is past for a: nothing to follow
        assert a_sick.healthy
    finally:
        sb.close()
        sa.close()


def test_another_workers_ejection_spares_the_last_replica_in_rotation(tmp_path: Path) -> None:
    path = create(str(tmp_path), 2)
    sa, sb = SharedCounts(path, 2, pid=os.getppid()), SharedCounts(path, 2)
    try:
        (ea, a_sick, a_other), (eb, b_sick, _) = ejector_worker(sa), ejector_worker(sb)
        for _ in range(3):
            eb.failure(b_sick, "reset")
        assert b_sick.state is BackendState.EJECTED
        a_other.state = BackendState.UNHEALTHY  # in worker a, 'sick' is the model's last replica
        ea.follow_once()
        assert a_sick.healthy
    finally:
        sb.close()
        sa.close()
