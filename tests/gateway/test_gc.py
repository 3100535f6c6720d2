"""The gateway freezes its startup heap: a full collection of it stalled every request in flight
for 22-38 ms (bench/compare's p99 at 64 concurrent, gc.callbacks timing in the gateway)."""

from __future__ import annotations

import asyncio
import gc

from fleetspec.infernet import BackendSpec
from gateway.app import FleetGateway
from gateway.settings import GatewaySettings
from tests.gateway.test_drain import BODY, Client, _gateway
from tests.support.procs import FakeVllm


def test_startup_heap_is_frozen_before_serving() -> None:
    gc.unfreeze()
    gw = FleetGateway(GatewaySettings(), [BackendSpec("a", "http://127.0.0.1:9", ["m"])], None)

    async def serving() -> tuple[int, int]:
        before = gc.get_freeze_count()
        async with gw.api.router.lifespan_context(gw.api):
            return before, gc.get_freeze_count()

    try:
        before, serving_count = asyncio.run(serving())
    finally:
        gc.unfreeze()
    assert before == 0
    # Everything imported and built before the first request: FastAPI, pydantic, the app itself.
    assert serving_count > 10_000


async def test_a_streamed_completion_leaves_no_reference_cycles(fakes: list[FakeVllm]) -> None:
    """A request's objects go when it ends, not at the next collection: each streamed completion
    once left a cycle (its flight → the relay's ``answered`` → the stream → the flight) of about 25
    objects, and the collections that freed them paused the gateway 10-25 ms under Poisson
    arrivals (bench/compare/poisson.py, gc.callbacks timing)."""
    gw = _gateway(fakes[0])
    try:
        await asyncio.wait_for(Client(gw, BODY).task, 10)  # first use: pools and caches that stay
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds goes to gc.garbage, to be looked at
        try:
            clients = [Client(gw, BODY) for _ in range(3)]
            await asyncio.wait_for(asyncio.gather(*(c.task for c in clients)), 10)
            gc.collect()
            cyclic = sorted({type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith("gateway.")})
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        assert all(c.ended_cleanly() for c in clients)
        assert cyclic == []
    finally:
        await gw.proxy.stop()
