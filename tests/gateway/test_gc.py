"""The gateway freezes its startup heap: a full collection of it stalled every request in flight
for 22-38 ms (bench/compare's p99 at 64 concurrent, gc.callbacks timing in the gateway)."""

from __future__ import annotations

import asyncio
import gc

from fleetspec.infernet import BackendSpec
from gateway.app import YOUNG_GC_THRESHOLD, FleetGateway
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


def test_serving_raises_the_young_generation_threshold_and_restores_it() -> None:
    """While serving, the first generation is collected at YOUNG_GC_THRESHOLD net allocations, not
    CPython's 700: at 700 the requests in flight alone set off a collection every ~48 requests at 64
    concurrent, each finding nothing (see app.py). The thresholds are the process's: they go back."""
    gw = FleetGateway(GatewaySettings(), [BackendSpec("a", "http://127.0.0.1:9", ["m"])], None)
    before = gc.get_threshold()

    async def serving() -> tuple[int, int, int]:
        async with gw.api.router.lifespan_context(gw.api):
            return gc.get_threshold()

    try:
        during = asyncio.run(serving())
    finally:
        gc.unfreeze()
    assert before[0] < YOUNG_GC_THRESHOLD
    assert during == (YOUNG_GC_THRESHOLD, *before[1:])
    assert gc.get_threshold() == before


async def _cyclic_types(gw: FleetGateway, body: dict[str, object], n: int) -> tuple[list[Client], list[str]]:
    """``n`` requests at once after a first one; the types of the objects that only a collection
    would free (gc.DEBUG_SAVEALL keeps them in gc.garbage)."""
    await asyncio.wait_for(Client(gw, body).task, 10)  # first use: pools and caches that stay
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        clients = [Client(gw, body) for _ in range(n)]
        await asyncio.wait_for(asyncio.gather(*(c.task for c in clients)), 10)
        gc.collect()
        return clients, sorted({f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


async def test_a_completion_leaves_no_reference_cycles(fakes: list[FakeVllm]) -> None:
    """A non-streamed completion's objects all go by reference counting, none by a collection:
    what YOUNG_GC_THRESHOLD relies on (a request path that made cycles would fill the young
    generation and be collected in batches of that size)."""
    gw = _gateway(fakes[0])
    try:
        clients, cyclic = await _cyclic_types(gw, {**BODY, "stream": False}, 8)
        assert all(c.sent[0]["status"] == 200 and c.sent[-1].get("more_body") is False for c in clients)
        assert cyclic == []
    finally:
        await gw.proxy.stop()


async def test_a_streamed_completion_leaves_no_reference_cycles(fakes: list[FakeVllm]) -> None:
    """A request's objects go when it ends, not at the next collection: each streamed completion
    once left a cycle (its flight → the relay's ``answered`` → the stream → the flight) of about 25
    objects, and the collections that freed them paused the gateway 10-25 ms under Poisson
    arrivals (bench/compare/poisson.py, gc.callbacks timing)."""
    gw = _gateway(fakes[0])
    try:
        clients, cyclic = await _cyclic_types(gw, BODY, 3)
        assert all(c.ended_cleanly() for c in clients)
        assert [t for t in cyclic if t.startswith("gateway.")] == []
    finally:
        await gw.proxy.stop()
