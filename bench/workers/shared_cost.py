"""What the shared in-flight counts (gateway/shared.py) add to each request's pass through the
limiter: ``enter``, ``acquire``, ``release``, ``leave`` with one worker (no table) against a
worker of 4 (its own row written, 8 rows summed per limit check), in one process, in alternating
passes, 3 replicas behind the model and the limits never reached. Prints µs per request for each
and the difference; the whole request costs ~100-200 µs of gateway CPU (bench/compare).

    python bench/workers/shared_cost.py [--requests 200000] [--passes 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

from fleetspec.tiers import VramTier
from gateway.backend import Backend, BackendSet
from gateway.limiter import Limiter
from gateway.metrics import GatewayMetrics
from gateway.pool import BackendPool
from gateway.settings import GatewaySettings
from gateway.shared import SharedCounts, create
from gateway.state import BackendState
from gateway.workers import shared_rows


def limiter(workers: int, shared: SharedCounts | None) -> Limiter:
    backends = []
    for i in range(3):
        b = Backend(f"backend-{i}", f"http://b{i}", VramTier.UNKNOWN, ["m"], ["m"], max_num_seqs=256)
        b.state = BackendState.HEALTHY
        backends.append(b)
    return Limiter(BackendPool(BackendSet(backends), None, shared=shared), GatewaySettings(workers=workers),
                   GatewayMetrics())


async def per_request_us(lim: Limiter, n: int) -> float:
    deadline = asyncio.get_running_loop().time() + 3600
    t = time.perf_counter()
    for _ in range(n):
        lim.enter()
        b = await lim.acquire("m", (), deadline)
        assert b is not None
        lim.release(b)
        lim.leave()
    return (time.perf_counter() - t) / n * 1e6


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=200_000)
    p.add_argument("--passes", type=int, default=5)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        shared = SharedCounts(create(d, shared_rows(4)), shared_rows(4))
        one, four = limiter(1, None), limiter(4, shared)
        await per_request_us(one, 1000)
        await per_request_us(four, 1000)
        alone, with_table = [], []
        for _ in range(a.passes):
            alone.append(await per_request_us(one, a.requests))
            with_table.append(await per_request_us(four, a.requests))
        shared.close()
    m1, m4 = statistics.median(alone), statistics.median(with_table)
    print(f"one worker, no table:   {m1:.2f} µs/request (passes: {', '.join(f'{x:.2f}' for x in alone)})")
    print(f"4 workers, shared table: {m4:.2f} µs/request (passes: {', '.join(f'{x:.2f}' for x in with_table)})")
    print(f"added by the table: {m4 - m1:+.2f} µs/request ({m4 / m1:.2f}x the limiter's own cost)")


if __name__ == "__main__":
    asyncio.run(main())
