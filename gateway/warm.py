"""Upstream connections opened before requests need them (``FLEET_UPSTREAM_WARM``).

A request that must open a new connection to vLLM waits until vLLM's server accepts it. Idle, vLLM
accepts at once; serving a burst, it accepted one new connection every 15-50 ms, so the last of 256
burst requests waited 2.4 s while requests on open connections were read in about 20 ms (H100,
bench/gpu/results/serve-accept-1). So every backend in rotation holds this worker's share of its
concurrency limit (the limiter's: FLEET_BACKEND_MAX_CONCURRENCY, else vLLM's --max-num-seqs) in
open connections, opened while it enters rotation and topped up every probe interval.

That only holds if the backend keeps idle connections open longer than a probe interval: vLLM
closes them after VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s by default), and each top-up would open them
again. ``vllm-fleet up`` sets both (docs/gateway.md#warm-upstream-connections); a gateway on its own
has it off unless FLEET_UPSTREAM_WARM is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource

from gateway.backend import Backend, BackendSet
from gateway.limiter import Limiter
from gateway.state import BackendState
from gateway.upstream import UpstreamPool

log = logging.getLogger("gateway.warm")


def fd_budget() -> int:
    """Connections this process may hold warm: half its file descriptors, the other half left to
    clients and requests. The soft limit is raised to the hard one first (often 1,024 against
    1,048,576), as a proxy needs two descriptors per request in flight anyway."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft // 2


class Warmer:
    def __init__(self, backends: BackendSet, limiter: Limiter, upstream: UpstreamPool, interval_s: float,
                 workers: int) -> None:
        self.backends = backends
        self.limiter = limiter
        self.upstream = upstream
        self.interval_s = interval_s
        self.workers = workers
        self.budget = 0
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        backends.subscribe(self._changed)

    def start(self) -> None:
        self.budget = fd_budget()
        self._task = asyncio.create_task(self._run(), name="upstream-warm")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def target(self, b: Backend) -> int:
        """This worker's share of ``b``'s concurrency limit (0: no limit, nothing to size it by)."""
        return -(-self.limiter.gateway_limit(b) // self.workers)

    def _changed(self, b: Backend, old: BackendState | None, new: BackendState | None) -> None:
        if new is BackendState.HEALTHY:
            self._kick.set()  # warm it now, not at the next interval

    async def _run(self) -> None:
        while True:
            self._kick.clear()
            left = self.budget
            for b in list(self.backends):
                n = min(self.target(b), left)
                if b.state is not BackendState.HEALTHY or n <= 0:
                    continue
                try:
                    left -= await self.upstream.warm(b.url, n)
                except Exception:  # never let one backend's failure end the warming of the others
                    log.exception("warming connections to %s failed", b.name)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await self._kick.wait()
