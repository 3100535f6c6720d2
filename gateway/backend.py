"""One upstream server as the gateway sees it: health state, models and load.

State contract (only the health checker and the proxy change it, both on the event loop):
- ``unknown``: not probed yet; out of rotation. First good probe -> ``healthy``;
  ``health_failures`` bad probes in a row -> ``unhealthy``.
- ``healthy``: in rotation. ``health_failures`` bad probes in a row -> ``unhealthy``.
- ``unhealthy``: out of rotation. ``health_successes`` good probes in a row -> ``healthy``.
- ``ejected``: out of rotation after failed requests (gateway/ejection.py, the only way in), until
  ``ejected_until``; the first good probe after that -> ``healthy``. ``health_failures`` bad probes
  in a row -> ``unhealthy``, as from any state. Ejection is passive and quick; only a probe, never
  the mere passing of time, puts a backend back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetspec.infernet import BackendSpec
from fleetspec.tiers import VramTier

if TYPE_CHECKING:
    from gateway.loadscrape import UpstreamLoad

UNKNOWN = "unknown"
HEALTHY = "healthy"
UNHEALTHY = "unhealthy"
EJECTED = "ejected"


@dataclass(eq=False)
class Backend:
    name: str
    url: str
    vram_tier: VramTier
    configured_models: list[str]
    models: list[str] = field(default_factory=list)  # what routing uses
    cards: dict[str, dict[str, Any]] = field(default_factory=dict)  # upstream /v1/models entries
    state: str = UNKNOWN
    in_flight: int = 0
    ok_streak: int = 0
    fail_streak: int = 0
    last_error: str | None = None
    last_change: float = field(default_factory=time.time)
    request_failures: int = 0  # failed requests in a row (passive check); any good answer resets it
    ejections: int = 0  # ejections in a row: the exponent of the next ejection period
    ejected_until: float = 0.0  # wall clock
    load: UpstreamLoad | None = None  # the last scrape of its /metrics (load-aware routing only)

    @classmethod
    def from_spec(cls, spec: BackendSpec) -> Backend:
        return cls(spec.name, spec.url, spec.vram_tier, list(spec.models), list(spec.models))

    @property
    def healthy(self) -> bool:
        return self.state == HEALTHY

    def record_probe(self, ok: bool, error: str | None, failures: int, successes: int) -> bool:
        """Apply one probe result; True when the backend changed state."""
        before = self.state
        if ok:
            self.ok_streak += 1
            self.fail_streak = 0
            self.last_error = None
            if self.state == UNKNOWN or (self.state == UNHEALTHY and self.ok_streak >= successes) \
                    or (self.state == EJECTED and time.time() >= self.ejected_until):
                self.state = HEALTHY
        else:
            self.fail_streak += 1
            self.ok_streak = 0
            self.last_error = error
            if self.state != UNHEALTHY and self.fail_streak >= failures:
                self.state = UNHEALTHY
        if self.state != before:
            self.last_change = time.time()
            if self.state == HEALTHY:
                self.request_failures = 0
            return True
        return False

    def eject(self, seconds: float) -> None:
        self.state = EJECTED
        self.ejected_until = time.time() + seconds
        self.ejections += 1
        self.last_change = time.time()

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name, "url": self.url, "models": self.models, "healthy": self.healthy,
            "state": self.state, "in_flight": self.in_flight, "vram_tier": self.vram_tier.value,
            "consecutive_failures": self.fail_streak, "last_error": self.last_error,
            "since": self.last_change, "request_failures": self.request_failures,
            "ejected_until": self.ejected_until if self.state == EJECTED else None,
            "load": None if self.load is None else {
                "running": self.load.running, "waiting": self.load.waiting, "kv_cache_usage": self.load.kv_usage,
                "prefix_cache_hit_rate": (self.load.prefix_hits / self.load.prefix_queries
                                          if self.load.prefix_queries else None),
                "age_s": round(time.monotonic() - self.load.at, 3)},
        }
