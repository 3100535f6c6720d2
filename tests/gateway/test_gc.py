"""The gateway freezes its startup heap: a full collection of it stalled every request in flight
for 22-38 ms (bench/compare's p99 at 64 concurrent, gc.callbacks timing in the gateway)."""

from __future__ import annotations

import asyncio
import gc

from fleetspec.infernet import BackendSpec
from gateway.app import FleetGateway
from gateway.settings import GatewaySettings


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
