"""The workers' shared probe verdicts (gateway/health.py with gateway/shared.py): two workers'
health checkers in one process over one table, each with its own Backend object, probes stubbed."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetspec.tiers import VramTier
from gateway.backend import Backend, BackendSet
from gateway.health import HealthChecker
from gateway.settings import GatewaySettings
from gateway.shared import SharedCounts, create
from gateway.state import BackendState, Writer

S = BackendState


class Worker:
    """One worker's checker over its own view of the replicas ``sick`` and ``other``."""

    def __init__(self, shared: SharedCounts) -> None:
        self.sick, self.other = (Backend(n, f"http://{n}", VramTier.UNKNOWN, ["m"], ["m"]) for n in ("sick", "other"))
        for b in (self.sick, self.other):
            b.state = S.HEALTHY
        settings = GatewaySettings(workers=2, health_failures=1, health_successes=2)
        self.health = HealthChecker(BackendSet([self.sick, self.other]), settings, shared=shared)
        self.answer: tuple[bool, str | None] = (True, None)

        async def probe(_: Backend) -> tuple[bool, str | None]:
            return self.answer

        async def discover(_: Backend) -> None:
            return None  # the models are configured

        self.health._probe = probe  # type: ignore[method-assign]
        self.health._discover = discover  # type: ignore[method-assign]

    async def probe(self, ok: bool) -> None:
        self.answer = (ok, None if ok else "/health answered 503")
        await self.health.probe_once(self.sick)


@pytest.fixture
def two(tmp_path: Path) -> Iterator[tuple[Worker, Worker]]:
    path = create(str(tmp_path), 2)
    sa, sb = SharedCounts(path, 2, pid=os.getppid()), SharedCounts(path, 2)
    try:
        yield Worker(sa), Worker(sb)
    finally:
        sb.close()
        sa.close()


async def test_one_workers_verdict_moves_every_worker_both_ways(two: tuple[Worker, Worker]) -> None:
    a, b = two
    b.sick.ok_streak = 7  # b's own good probes: not enough to bring it back once it adopts
    await a.probe(False)
    assert a.sick.state is S.UNHEALTHY and b.sick.healthy
    b.health.follow_once()
    assert b.sick.state is S.UNHEALTHY and b.sick.ok_streak == 0
    assert b.sick.last_error == "another gateway worker's probes failed"
    assert b.other.healthy  # only the backend the verdict was about
    await b.probe(True)
    assert b.sick.state is S.UNHEALTHY  # 1 of the 2 good probes it needs, counted from the adoption
    await b.probe(True)
    assert b.sick.healthy
    a.health.follow_once()
    assert a.sick.healthy and a.sick.last_error is None
    a.health.follow_once()  # nothing newer: no move
    assert a.sick.healthy


async def test_a_verdict_older_than_the_workers_own_change_is_not_adopted(two: tuple[Worker, Worker]) -> None:
    a, b = two
    await a.probe(False)
    # Meanwhile the supervisor put it to sleep: a probe's verdict never wakes or moves a sleeper.
    b.sick.move(Writer.SUPERVISOR, S.ASLEEP)
    b.health.follow_once()
    assert b.sick.state is S.ASLEEP
    # Handed back after the verdict: b probes it afresh rather than take a's earlier word.
    b.sick.move(Writer.SUPERVISOR, S.UNKNOWN)
    b.health.follow_once()
    assert b.sick.state is S.UNKNOWN


async def test_an_ejected_backend_comes_back_through_another_worker_only_after_its_end(
        two: tuple[Worker, Worker]) -> None:
    a, b = two
    await a.probe(False)
    await a.probe(True)
    b.sick.eject(60)  # b ejected it after a's probes had failed
    await a.probe(True)  # a's second good probe: healthy in a, newer than b's ejection
    assert a.sick.healthy
    b.health.follow_once()
    assert b.sick.state is S.EJECTED  # its ejection (shared by ejection.py) has not ended
    b.sick.ejected_until = time.time()
    b.health.follow_once()
    assert b.sick.healthy
