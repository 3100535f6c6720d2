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
"""

from __future__ import annotations

import logging
import time

from gateway.backend import Backend, BackendSet
from gateway.metrics import GatewayMetrics
from gateway.settings import GatewaySettings

log = logging.getLogger("gateway.ejection")

# Statuses that say "this server could not do it", as opposed to "this request was wrong".
FAILURE_STATUSES = frozenset({502, 503, 504})


class Ejector:
    def __init__(self, backends: BackendSet, settings: GatewaySettings, metrics: GatewayMetrics) -> None:
        self.backends = backends
        self.threshold = settings.eject_failures
        self.base_s = settings.eject_base_s
        self.max_s = settings.eject_max_s
        self.metrics = metrics

    def failure(self, b: Backend, why: str) -> None:
        b.request_failures += 1
        if not b.healthy or b.request_failures < self.threshold:
            return
        if self.backends.last_in_rotation(b):
            return
        # A backend that stayed in rotation longer than its last ejection starts over at the base.
        if b.ejections and time.time() - b.last_change > self._period(b.ejections - 1):
            b.ejections = 0
        period = self._period(b.ejections)
        b.eject(period)
        self.metrics.ejections.labels(b.name).inc()
        log.warning("backend %s ejected for %.1fs after %d failed requests in a row (last: %s)",
                    b.name, period, b.request_failures, why)

    def _period(self, n: int) -> float:
        return float(min(self.max_s, self.base_s * 2 ** min(n, 32)))
