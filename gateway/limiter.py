"""Backpressure: a concurrency limit per backend, a bounded FIFO per model, a cap on the gateway.

A request takes a slot on the replica its model's policy chooses (BackendPool.pick); when that one
is at ``backend_max_concurrency``, on the least-loaded other replica with a free slot. When every
replica is full, the request waits in its model's FIFO,
which holds ``backend_queue`` places per replica of the model. A slot freed by a finishing request
goes straight to the oldest waiter that may use that backend (a retry may not reuse a replica it
tried), so nobody arriving later overtakes the queue. A full queue answers 429 at once, a wait
longer than ``queue_timeout_s`` answers 429 too, and the global ``max_in_flight`` (queued requests
included) answers 429 before any of that. A client that disconnects while queued is cancelled by
the proxy's watcher, which takes it out of the queue here.

Per request without queueing this costs one pick, two integer updates and a check of ``waiting``;
with several workers also a sum over the workers of the model's queued count.

With several workers the counts that the limits and the queue's capacity compare are the whole
gateway's (shared.py): a worker writes its own counts to the shared table and compares each limit
with the sum over the workers. Each worker hands slots to its own waiters, oldest first; a slot
freed in another worker is not announced, so while this worker has waiters it looks again every
``SHARED_POLL_S``. The queue stays first come, first served across workers: each worker publishes
when its oldest waiter for each model queued, and a worker whose own oldest came later leaves a
free slot to the worker with the older one, whose next look takes it; while requests wait, a new
one joins the queue rather than take a slot freed in between. A retry waiting for a
replica other than those it tried is not published (it may not be able to use the free one), and
a worker that leaves a slot takes it after all if the slot stays free for ``FIFO_GRACE_NS``: the
other worker may be stalled, or see that backend out of rotation for the moment.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence

from gateway.backend import Backend
from gateway.metrics import GatewayMetrics
from gateway.pool import BackendPool
from gateway.routing import Hint
from gateway.settings import GatewaySettings
from gateway.shared import GATEWAY, OLDEST, QUEUED, SharedCounts, column_of, publish
from gateway.state import BackendState

QUEUE_FULL = "queue_full"
QUEUE_TIMEOUT = "queue_timeout"
MAX_IN_FLIGHT = "max_in_flight"
SHARED_POLL_S = 0.005
FIFO_GRACE_NS = 50_000_000  # ten looks of the worker with the older waiter


class Rejected(Exception):
    """The gateway is too busy for this request: answer 429 with Retry-After."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class _Waiter:
    __slots__ = ("exclude", "fut", "queued", "seq", "since_ns")

    def __init__(self, seq: int, fut: asyncio.Future[Backend], exclude: tuple[Backend, ...]) -> None:
        self.seq = seq
        self.since_ns = time.monotonic_ns()  # one clock for every process on the host: workers compare it
        self.fut = fut
        self.exclude = exclude
        self.queued = True


class Limiter:
    def __init__(self, pool: BackendPool, settings: GatewaySettings, metrics: GatewayMetrics) -> None:
        self.pool = pool
        self.shared = pool.shared
        self._poller: asyncio.Task[None] | None = None
        self.metrics = metrics
        self._fixed = settings.backend_max_concurrency  # None: each backend's own max_num_seqs
        self._workers = settings.workers
        self.queue_per_replica = settings.backend_queue
        self.queue_timeout_s = settings.queue_timeout_s
        self.wake_timeout_s = settings.wake_timeout_s
        # Told (model, waiting) whenever a model's queue changes; set when a supervisor can wake
        # sleeping instances (control.py): requests for a model that is asleep then wait for it.
        self.on_queue: Callable[[str, int], None] | None = None
        self.max_in_flight = settings.max_in_flight
        self.in_flight = 0  # requests inside the gateway past parsing, queued ones included
        self.waiting = 0
        self._queues: dict[str, deque[_Waiter]] = {}
        self._seq = itertools.count()
        # Backend name -> when this worker first left its free slot to an older waiter in another worker.
        self._deferred: dict[str, int] = {}
        pool.backends.subscribe(self._changed)

    def gateway_limit(self, b: Backend) -> int:
        """Requests ``b`` takes at once from the whole gateway (0: no limit): the setting, else its
        vLLM's --max-num-seqs, else none. vLLM runs that many and queues the rest itself; a lower
        cap here moves that queue into the gateway, first come first served. Measured with the tiny
        model on an H100 at 1,024 concurrent against vLLM's 1,024: a cap of 512 gave 1.19× direct's
        tokens/s and a cap of 256 0.98×, both at about 2.5-3.2× direct's TTFT p50
        (bench/gpu/results/serve-pairs-h100); on H200 a cap of 256 added 29 % TTFT at 512."""
        total = self._fixed if self._fixed is not None else b.max_num_seqs
        return total or 0

    def limit(self, b: Backend) -> int:
        """``gateway_limit``, compared with the count over every worker; only a backend the shared
        table has no column for (more than 1,023 names) gets 1/N of it per worker."""
        total = self.gateway_limit(b)
        if total and self._workers > 1 and column_of(self.shared, b) is None:
            return -(-total // self._workers)
        return total

    def has_room(self, b: Backend) -> bool:
        limit = self.limit(b)
        return not limit or self.pool.count(b) < limit

    def total_in_flight(self) -> int:
        return self.in_flight if self.shared is None else self.shared.total(GATEWAY)

    def enter(self) -> None:
        n = self.total_in_flight()
        if n >= self.max_in_flight:
            raise Rejected(MAX_IN_FLIGHT, f"the gateway has {n} requests in flight, its limit")
        self.in_flight += 1
        if self.shared is not None:
            self.shared.set(GATEWAY, self.in_flight)

    def leave(self) -> None:
        self.in_flight -= 1
        if self.shared is not None:
            self.shared.set(GATEWAY, self.in_flight)

    async def acquire(self, model: str, exclude: Sequence[Backend], deadline: float,
                      hint: Hint | None = None) -> Backend | None:
        """A replica of ``model`` with its slot taken, or None when none is in rotation.

        Waits (FIFO, until ``deadline`` in loop time or the queue timeout) while the chosen one is
        full; a queued request takes the first slot freed on any replica it may use."""
        b = self.pool.pick(model, exclude, hint)
        if b is None:
            if self.on_queue is not None and self.pool.backends.servable(model):
                return await self._wait(model, exclude, deadline, waking=True)  # asleep: wait for the wake
            return None
        if self.shared is not None and self._queue_ahead(model):
            return await self._wait(model, exclude, deadline)
        if not self.has_room(b):
            # A policy other than least-in-flight may choose a full replica while another has room.
            b = self.pool.least_busy(model, exclude, self.has_room)
            if b is None:
                return await self._wait(model, exclude, deadline)
        self._take(b)
        return b

    def release(self, b: Backend) -> None:
        b.in_flight -= 1
        publish(self.shared, b, b.in_flight)
        self.metrics.backend_in_flight(b.name, b.in_flight)
        if self.waiting:
            self._handoff(b)

    def _changed(self, b: Backend, old: BackendState | None, new: BackendState | None) -> None:
        """``b`` came (back) into rotation: let waiters have its free slots."""
        if new is BackendState.HEALTHY and self.waiting:
            self._handoff(b)

    def _take(self, b: Backend) -> None:
        b.last_request = time.time()  # idle time and least-recently-used, for the swap policy
        b.in_flight += 1
        publish(self.shared, b, b.in_flight)
        self.metrics.backend_in_flight(b.name, b.in_flight)

    async def _wait(self, model: str, exclude: Sequence[Backend], deadline: float,
                    waking: bool = False) -> Backend | None:
        q = self._queues.get(model)
        if q is None:
            q = self._queues[model] = deque()
        capacity = self.queue_per_replica * self.pool.replicas(model)
        if self._queued(model, q) >= capacity:
            raise Rejected(QUEUE_FULL, f"every replica of '{model}' is busy and its queue of {capacity} is full")
        loop = asyncio.get_running_loop()
        queued_at = loop.time()
        w = _Waiter(next(self._seq), loop.create_future(), tuple(exclude))
        q.append(w)
        self.waiting += 1
        self._depth(model, q)
        if self.shared is not None and self._poller is None:
            self._poller = asyncio.create_task(self._poll_others())
        try:
            try:
                limit = self.wake_timeout_s if waking else self.queue_timeout_s
                async with asyncio.timeout_at(min(loop.time() + limit, deadline)):
                    return await w.fut
            except BaseException:
                # Handed a slot in the same loop turn as the timeout or the client's disconnect.
                if w.fut.done() and not w.fut.cancelled():
                    self.release(w.fut.result())
                raise
        except TimeoutError:
            if waking or not self.pool.has_other(model, exclude):
                return None  # nothing left in rotation: the caller answers 503, not "busy"
            raise Rejected(QUEUE_TIMEOUT, f"no replica of '{model}' became free within "
                           f"{self.queue_timeout_s}s") from None
        finally:
            self.metrics.queue_wait.labels(model).observe(loop.time() - queued_at)
            if w.queued:
                w.queued = False
                q.remove(w)
                self.waiting -= 1
                self._depth(model, q)

    async def _poll_others(self) -> None:
        """While this worker has waiters: hand them slots that other workers freed."""
        try:
            while self.waiting:
                await asyncio.sleep(SHARED_POLL_S)
                for b in self.pool.backends:
                    if self.waiting and b.healthy:
                        self._handoff(b)
        finally:
            self._poller = None

    def _handoff(self, b: Backend) -> None:
        while True:
            if not (b.healthy and self.has_room(b)):
                self._deferred.pop(b.name, None)  # no free slot left to wait over
                return
            found = self._oldest_for(b)
            if found is None:
                return
            model, q, w = found
            if self._older_elsewhere(b, model, w):
                return
            w.queued = False
            q.remove(w)
            self.waiting -= 1
            self._depth(model, q)
            self._take(b)
            w.fut.set_result(b)

    def _queue_ahead(self, model: str) -> bool:
        """Requests for ``model`` wait in the gateway's queue (retries that may not use every
        replica aside): a new one joins it. A slot freed in one worker waits up to
        ``SHARED_POLL_S`` for the worker with the oldest waiter to look, and a new request must not
        take it in between."""
        cells = self._model_cells(model)
        if cells is None:
            return False
        shared, col = cells
        if not shared.total(col, QUEUED):
            return False
        return any(not w.exclude for w in self._queues.get(model, ())) or shared.smallest_of_others(col, OLDEST) != 0

    def _older_elsewhere(self, b: Backend, model: str, w: _Waiter) -> bool:
        """Another worker's waiter for ``model`` queued before ``w``: leave ``b``'s free slot to it,
        for ``FIFO_GRACE_NS`` at most."""
        cells = self._model_cells(model)
        if cells is None:
            return False
        shared, col = cells
        other = shared.smallest_of_others(col, OLDEST)
        if not other or other >= w.since_ns:
            self._deferred.pop(b.name, None)
            return False
        now = time.monotonic_ns()
        if now - self._deferred.setdefault(b.name, now) < FIFO_GRACE_NS:
            return True
        self._deferred.pop(b.name, None)
        return False

    def _oldest_for(self, b: Backend) -> tuple[str, deque[_Waiter], _Waiter] | None:
        best: tuple[str, deque[_Waiter], _Waiter] | None = None
        for m in b.models:
            q = self._queues.get(m)
            if not q:
                continue
            for w in q:
                if not w.fut.done() and b not in w.exclude:
                    if best is None or w.seq < best[2].seq:
                        best = (m, q, w)
                    break
        return best

    def _queued(self, model: str, q: deque[_Waiter]) -> int:
        """Requests waiting for ``model`` in the whole gateway."""
        cells = self._model_cells(model)
        return len(q) if cells is None else cells[0].total(cells[1], QUEUED)

    def _model_cells(self, model: str) -> tuple[SharedCounts, int] | None:
        """The workers' table and ``model``'s column in it; None with one worker, or when the table
        has no column for it (this worker then counts that model's queue alone)."""
        col = None if self.shared is None else self.shared.column(model)
        return None if col is None or self.shared is None else (self.shared, col)

    def _depth(self, model: str, q: deque[_Waiter]) -> None:
        if (cells := self._model_cells(model)) is not None:
            shared, col = cells
            shared.set(col, len(q), QUEUED)
            shared.set(col, next((w.since_ns for w in q if not w.exclude), 0), OLDEST)
        self.metrics.queue_depth.labels(model).set(len(q))
        if self.on_queue is not None:
            self.on_queue(model, len(q))
