"""A pool kept even over the processes that accept on one port (gateway/accept_split.py), as vLLM's
API servers share one (``--api-server-count``): which process serves each connection, read from the
kernel's tables, and idle connections moved off a process holding more than its share. The
processes are tests/support/shared_listener.py's: real forks on one real listening socket."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetspec.infernet import BackendSpec
from gateway.accept_split import ServerEnds, _addr, surplus
from gateway.app import FleetGateway
from gateway.settings import GatewaySettings
from gateway.state import BackendState
from gateway.upstream import UpstreamPool
from gateway.warm import Warmer

LISTENER = Path(__file__).resolve().parents[1] / "support" / "shared_listener.py"
POOL = 16


async def read_all(pool: UpstreamPool, port: int) -> tuple[dict[tuple[str, int], int], set[int]]:
    """ServerEnds.read once every connection of ``pool`` was accepted (one still in the listen
    queue has no process yet)."""
    origin = next(iter(pool._origins.values()))
    for _ in range(200):
        served, accepting = (await asyncio.to_thread(ServerEnds().read, {port}))[port]
        if all(c.local in served for c in origin.conns):
            return served, accepting
        await asyncio.sleep(0.01)
    raise AssertionError("connections not accepted in 2 s")


class Listener:
    def __init__(self, gates: Path) -> None:
        self.gates = gates
        self.proc = subprocess.Popen([sys.executable, str(LISTENER), str(gates), "2"], stdout=subprocess.PIPE,
                                     text=True, start_new_session=True)
        assert self.proc.stdout is not None
        port, *kids = self.proc.stdout.readline().split()
        self.port = int(port)
        self.kids = [int(k) for k in kids]
        self.url = f"http://127.0.0.1:{self.port}"

    def open(self, i: int) -> None:
        (self.gates / str(i)).touch()

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[Listener]:
    server = Listener(tmp_path)
    try:
        yield server
    finally:
        server.stop()


def test_addresses_from_the_kernel_table() -> None:
    assert _addr("0100007F:1F41") == ("127.0.0.1", 8001)
    assert _addr("00000000000000000000000001000000:0050") == ("::1", 80)
    assert _addr("0000000000000000FFFF00000100007F:1F41") == ("127.0.0.1", 8001)  # IPv4-mapped


def test_surplus_moves_what_is_over_an_even_share() -> None:
    assert surplus({1: 16, 2: 0}, {1, 2}) == {1: 8}
    assert surplus({1: 9, 2: 7}, {1, 2}) == {}  # within 15 % of the share
    assert surplus({1: 11, 2: 5}, {1, 2}) == {}  # 3 over: not worth a re-dial
    assert surplus({1: 600, 2: 424}, {1, 2}) == {1: 88}
    assert surplus({1: 5, 2: 0}, {1, 2}) == {}  # 2.5 over: not worth a re-dial
    assert surplus({1: 16}, {1}) == {}  # one process: nothing to even out
    assert surplus({1: 9, 2: 0, 3: 0}, {1, 2, 3}) == {1: 6}
    assert surplus({7: 3, 1: 12, 2: 0}, {1, 2}) == {1: 6}  # only the accepting processes count


async def test_which_process_serves_each_connection(listener: Listener) -> None:
    listener.open(0)
    pool = UpstreamPool(5)
    try:
        assert await pool.warm(listener.url, POOL) == POOL
        served, accepting = await read_all(pool, listener.port)
        assert accepting == set(listener.kids)  # the parent holds the socket too but is not one
        origin = pool._origins[listener.url]
        assert {served[c.local] for c in origin.conns if c.local} == {listener.kids[0]}  # the other one is gated
        assert len(origin.conns) == POOL

        assert pool.rebalance(listener.url, served, accepting) == POOL // 2
        assert pool.split(listener.url) == [POOL, 0]
        listener.open(1)
        for _ in range(6):
            await pool.warm(listener.url, POOL, batch=1)
            served, accepting = await read_all(pool, listener.port)
            if pool.rebalance(listener.url, served, accepting) == 0:
                break
        split = pool.split(listener.url)
        assert sum(split) == POOL and not surplus({0: split[0], 1: split[1]}, {0, 1}), split
    finally:
        pool.close()


async def test_warmer_evens_out_and_waits_after_a_try_that_did_not_help(listener: Listener) -> None:
    listener.open(0)
    pool = UpstreamPool(5)
    # A gateway's own backends and limiter (not stand-ins: a build compiled with mypyc checks types).
    gw = FleetGateway(GatewaySettings(backend_max_concurrency=POOL), [BackendSpec("a", listener.url, ["m"])], None)
    gw.pool.backends[0].state = BackendState.HEALTHY
    warmer = Warmer(gw.pool.backends, gw.limiter, pool, 1.0, 1)
    warmer.budget = 1000
    try:
        await pool.warm(listener.url, POOL)
        await read_all(pool, listener.port)
        await warmer._rebalance()  # 16 / 0: 8 closed, dialled again; all on the one accepting
        assert pool.split(listener.url) == [POOL, 0]
        await read_all(pool, listener.port)
        await warmer._rebalance()  # the same again: no better, so it waits 2 rounds
        assert warmer._hold[listener.url][0] == 2
        listener.open(1)
        await read_all(pool, listener.port)
        await warmer._rebalance()
        await read_all(pool, listener.port)
        await warmer._rebalance()
        assert pool.split(listener.url) == [POOL, 0]  # waited: not read again
        for _ in range(20):  # a miss above makes it wait 4 rounds; then each try moves what is over
            await read_all(pool, listener.port)
            await warmer._rebalance()
            split = pool.split(listener.url)
            if not surplus({0: split[0], 1: split[1]}, {0, 1}):
                break
        assert sum(split) == POOL and not surplus({0: split[0], 1: split[1]}, {0, 1}), split
    finally:
        pool.close()
