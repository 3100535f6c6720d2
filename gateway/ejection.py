"""Passive ejection: a backend whose requests keep failing leaves rotation before the probes notice.

Active probes take ``health_failures × health_interval_s`` to see a dead or wedged server; requests
see it at once. After ``eject_failures`` failed requests in a row (connect error, reset before the
response, header or idle timeout, mid-stream failure, or a 502/503/504 answer) the backend is
ejected for ``eject_base_s``, doubled for each ejection that follows soon after the previous return
(up to ``eject_max_s``), so a flapping server spends ever longer out. It comes back only through a
good active probe after that period (backend.py). A client disconnect or the gateway's own total
timeout is not the backend's failure and does not count.

Passive checks alone never eject the last in-rotation replica of any model the backend serves:
a struggling replica still answers some requests, none at all answers none. Probes still can.

A writer of backend state (docs/architecture.md §2): it reads the replica index of the backend set
and moves the backend; the metrics and the routers learn of it as subscribers.

With several workers (shared.py) the failures in a row are the gateway's: each worker publishes
its own count and compares the sum over the workers with ``eject_failures``; a worker that ejects
publishes the ejection's end, and every other worker, looking every ``shared.SYNC_S``, ejects the backend
from its own rotation until then (under the same last-replica rule). It comes back through the
first good probe after the end, in any worker: probe verdicts are shared too (health.py).
"""

from __future__ import annotations

import logging
import time

from gateway.backend import Backend, BackendSet
from gateway.metrics import GatewayMetrics
from gateway.settings import GatewaySettings
from gateway.shared import EJECTED_UNTIL, FAILURES, Follower, SharedCounts, column_of, gateway_total, publish
from gateway.state import BackendState

log = logging.getLogger("gateway.ejection")

# Statuses that say "this server could not do it", as opposed to "this request was wrong".
FAILURE_STATUSES = frozenset({502, 503, 504})


class Ejector:
    def __init__(self, backends: BackendSet, settings: GatewaySettings, metrics: GatewayMetrics,
                 shared: SharedCounts | None = None) -> None:
        self.backends = backends
        self.threshold = settings.eject_failures
        self.base_s = settings.eject_base_s
        self.max_s = settings.eject_max_s
        self.metrics = metrics
        self.shared = shared
        self._follower = Follower(self.follow_once, "ejection-sync") if shared is not None else None
        if shared is not None:
            backends.subscribe(self._returned)

    def failure(self, b: Backend, why: str) -> None:
        b.request_failures += 1
        publish(self.shared, b, b.request_failures, FAILURES)
        failures = gateway_total(self.shared, b, b.request_failures, FAILURES)
        if not b.healthy or failures < self.threshold:
            return
        if self.backends.last_in_rotation(b):
            return
        # A backend that stayed in rotation longer than its last ejection starts over at the base.
        if b.ejections and time.time() - b.last_change > self._period(b.ejections - 1):
            b.ejections = 0
        period = self._period(b.ejections)
        b.eject(period)
        publish(self.shared, b, int(b.ejected_until * 1000), EJECTED_UNTIL)
        self.metrics.ejections.labels(b.name).inc()
        log.warning("backend %s ejected for %.1fs after %d failed requests in a row (last: %s)",
                    b.name, period, failures, why)

    def success(self, b: Backend) -> None:
        """A good answer: the failures in a row start again (a no-op while there are none)."""
        if b.request_failures:
            b.request_failures = 0
            publish(self.shared, b, 0, FAILURES)

    def _returned(self, b: Backend, _old: BackendState | None, new: BackendState | None) -> None:
        # Back in rotation (backend.move zeroed request_failures): this worker's count starts over.
        if new is BackendState.HEALTHY:
            publish(self.shared, b, 0, FAILURES)

    def start(self) -> None:
        if self._follower is not None:
            self._follower.start()

    async def stop(self) -> None:
        if self._follower is not None:
            await self._follower.stop()

    def follow_once(self) -> None:
        """Eject from this worker's rotation what another worker ejected, until the end it set."""
        assert self.shared is not None
        now = time.time()
        for b in list(self.backends):
            col = column_of(self.shared, b)
            if col is None or not b.healthy:
                continue
            until = self.shared.largest(col, EJECTED_UNTIL) / 1000
            if until <= now or self.backends.last_in_rotation(b):
                continue
            b.eject(until - now)
            log.warning("backend %s ejected for %.1fs by another gateway worker", b.name, until - now)

    def _period(self, n: int) -> float:
        return float(min(self.max_s, self.base_s * 2 ** min(n, 32)))
