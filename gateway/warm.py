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

After a round that opened connections it also evens each pool out over the API server processes
behind the backend's port (``_rebalance``, accept_split.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource

from gateway.accept_split import ServerEnds
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
        self.ends = ServerEnds()
        self._read_at: dict[str, int] = {}  # backend URL → its pool's dial count when its split was last read
        self._hold: dict[str, tuple[int, int, int]] = {}  # URL → (rounds left to wait, wait after a miss, last max)
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
            try:
                await self._rebalance()
            except Exception:
                log.exception("evening out connections over API servers failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await self._kick.wait()

    async def _rebalance(self) -> None:
        """Even out each backend's pool over the API servers behind its port (accept_split.py).
        A pool's split is read again only after connections were opened to it; the ones closed
        are dialled again at once. A backend where that did not lower its busiest API server's
        count waits 2, 4 ... 32 rounds before the next try: connections are not churned for nothing."""
        due: dict[int, list[Backend]] = {}
        for b in self.backends:
            d = self.upstream.dialled(b.url)
            if b.state is not BackendState.HEALTHY or d is None or self._read_at.get(b.url) == d[1]:
                continue
            left, wait, last = self._hold.get(b.url, (0, 1, 0))
            if left > 0:
                self._hold[b.url] = (left - 1, wait, last)
                continue
            self._read_at[b.url] = d[1]
            due.setdefault(d[0], []).append(b)
        if not due:
            return
        read = await asyncio.to_thread(self.ends.read, due)
        for port, backends in due.items():
            served, accepting = read.get(port, ({}, set()))
            for b in backends:
                closed = self.upstream.rebalance(b.url, served, accepting)
                if closed is None:
                    del self._read_at[b.url]  # read before vLLM accepted them all: again next round
                    closed = 0
                split = self.upstream.split(b.url)
                _, wait, last = self._hold.get(b.url, (0, 1, 0))
                most = split[0] if split else 0
                if last and closed and most >= last:
                    wait = min(wait * 2, 32)
                    self._hold[b.url] = (wait, wait, most)
                else:
                    self._hold[b.url] = (0, 1, most if closed else 0)
                if closed:
                    log.info("%s: %d connections to its busiest API server closed to even out %s", b.name, closed,
                             split)
                    # One at a time: dials that arrive together are all taken by whichever API server
                    # accepts first (16 of 16, real vLLM on CPU); one by one each goes to a free one.
                    await self.upstream.warm(b.url, min(self.target(b), self.budget), batch=1)
