"""The backends as the gateway sees them: each one's state, models and load, and the set of them.

State flows one way (docs/architecture.md §2). Writers (health.py, ejection.py, control.py) move a
backend with ``Backend.move``, along the edges of state.py; the ``BackendSet`` then tells every
subscriber (its own model index first, then the routers, the limiter, the metrics, the streams
that must migrate). Subscribers read and react; they never call back into a writer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fleetspec.infernet import BackendSpec
from fleetspec.tiers import VramTier
from gateway.load import UpstreamLoad
from gateway.state import ROUTABLE, SERVABLE, BackendState, Writer, check_move

S = BackendState
# A change: the backend, its state before and after; None means "not in the set" (added / removed).
Listener = Callable[["Backend", BackendState | None, BackendState | None], None]


@dataclass(eq=False)
class Backend:
    name: str
    url: str
    vram_tier: VramTier
    configured_models: list[str]
    models: list[str] = field(default_factory=list)  # what routing uses
    cards: dict[str, dict[str, Any]] = field(default_factory=dict)  # upstream /v1/models entries
    state: BackendState = S.UNKNOWN
    in_flight: int = 0
    ok_streak: int = 0
    fail_streak: int = 0
    last_error: str | None = None
    last_change: float = field(default_factory=time.time)
    request_failures: int = 0  # failed requests in a row (passive check); any good answer resets it
    ejections: int = 0  # ejections in a row: the exponent of the next ejection period
    ejected_until: float = 0.0  # wall clock
    load: UpstreamLoad | None = None  # the last scrape of its /metrics (load-aware routing only)
    # What the instance's owner last said (control.py), shown in /fleet; None without a supervisor.
    supervisor_state: str | None = None
    epoch: int = 0  # the supervisor's epoch of that state
    wakes: bool = False  # draining to sleep (not to go away): requests for it wait instead of failing
    last_request: float = 0.0  # wall clock of the last request routed here (idle time, LRU)
    max_num_seqs: int | None = None  # its vLLM's --max-num-seqs, when the config says (limiter.py)
    shared_column: int = -1  # its column in the workers' shared counts; -1 not asked yet, 0 none (shared.py)
    _set: BackendSet | None = field(default=None, repr=False)

    @classmethod
    def from_spec(cls, spec: BackendSpec) -> Backend:
        return cls(spec.name, spec.url, spec.vram_tier, list(spec.models), list(spec.models),
                   max_num_seqs=spec.max_num_seqs)

    @property
    def healthy(self) -> bool:
        """In rotation: requests may be sent to it."""
        return self.state in ROUTABLE

    @property
    def servable(self) -> bool:
        """Requests for its models are routed or wait for it; they are not refused."""
        return self.state in SERVABLE or (self.state is S.DRAINING and self.wakes)

    def move(self, writer: Writer, new: BackendState) -> None:
        old = self.state
        check_move(writer, old, new)
        self.state = new
        self.last_change = time.time()
        if new is S.HEALTHY:
            self.request_failures = 0
        if self._set is not None:
            self._set.changed(self, old, new)

    def record_probe(self, ok: bool, error: str | None, failures: int, successes: int) -> bool:
        """Apply one probe result; True when the backend changed state."""
        if ok:
            self.ok_streak += 1
            self.fail_streak = 0
            self.last_error = None
        else:
            self.fail_streak += 1
            self.ok_streak = 0
            self.last_error = error
        new = self._after_probe(ok, failures, successes)
        if new is None:
            return False
        self.move(Writer.PROBE, new)
        return True

    def _after_probe(self, ok: bool, failures: int, successes: int) -> BackendState | None:
        s = self.state
        if s in (S.ASLEEP, S.DRAINING):
            return None  # the supervisor's word wins: a sleeping vLLM answers /health with 200
        if ok:
            if s is S.UNKNOWN or (s is S.UNHEALTHY and self.ok_streak >= successes) \
                    or (s is S.EJECTED and time.time() >= self.ejected_until):
                return S.HEALTHY
            return None
        return S.UNHEALTHY if s is not S.UNHEALTHY and self.fail_streak >= failures else None

    def eject(self, seconds: float) -> None:
        self.ejected_until = time.time() + seconds
        self.ejections += 1
        self.move(Writer.REQUESTS, S.EJECTED)

    def describe(self, in_flight: int | None = None, request_failures: int | None = None) -> dict[str, Any]:
        """For /fleet and the console; ``in_flight``, ``request_failures``: the whole gateway's
        counts when it has workers."""
        return {
            "name": self.name, "url": self.url, "models": self.models, "healthy": self.healthy,
            "state": self.state.value, "in_flight": self.in_flight if in_flight is None else in_flight,
            "vram_tier": self.vram_tier.value,
            "consecutive_failures": self.fail_streak, "last_error": self.last_error,
            "since": self.last_change,
            "request_failures": self.request_failures if request_failures is None else request_failures,
            "ejected_until": self.ejected_until if self.state is S.EJECTED else None,
            "supervisor_state": self.supervisor_state, "last_request": self.last_request or None,
            "load": None if self.load is None else {
                "running": self.load.running, "waiting": self.load.waiting, "kv_cache_usage": self.load.kv_usage,
                "prefix_cache_hit_rate": (self.load.prefix_hits / self.load.prefix_queries
                                          if self.load.prefix_queries else None),
                "age_s": round(time.monotonic() - self.load.at, 3), "stalled": self.load.stalled},
        }


class BackendSet:
    """Every backend, the index of replicas by served name, and the subscribers to their changes.

    Membership changes (a live reload) and state changes reach subscribers in the order they
    subscribed; the model index is always current before any of them runs."""

    def __init__(self, backends: Iterable[Backend] = ()) -> None:
        self._all: list[Backend] = []
        self._by_model: dict[str, list[Backend]] = {}
        self._listeners: list[Listener] = []
        for b in backends:
            self.add(b)

    def __iter__(self) -> Iterator[Backend]:
        return iter(self._all)

    def __len__(self) -> int:
        return len(self._all)

    def __getitem__(self, i: int) -> Backend:
        return self._all[i]

    def get(self, name: str) -> Backend | None:
        return next((b for b in self._all if b.name == name), None)

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def changed(self, b: Backend, old: BackendState | None, new: BackendState | None) -> None:
        for listener in self._listeners:
            listener(b, old, new)

    # -- membership and models (writers: config reload, discovery) ------------------------------

    def add(self, b: Backend) -> None:
        b._set = self
        self._all.append(b)
        self._reindex()
        self.changed(b, None, b.state)

    def remove(self, b: Backend) -> None:
        self._all.remove(b)
        self._reindex()
        self.changed(b, b.state, None)
        b._set = None

    def set_models(self, b: Backend, names: list[str]) -> None:
        b.models = names
        self._reindex()

    def _reindex(self) -> None:
        by_model: dict[str, list[Backend]] = {}
        for b in self._all:
            for m in b.models:
                by_model.setdefault(m, []).append(b)
        self._by_model = by_model

    # -- reads ------------------------------------------------------------------------------------

    def replicas(self, model: str) -> list[Backend]:
        return self._by_model.get(model, [])

    def knows(self, model: str) -> bool:
        return model in self._by_model

    def served_models(self) -> list[str]:
        return sorted(self._by_model)

    @property
    def discovering(self) -> bool:
        """Some backend's models are still unknown, so an unknown name may yet appear."""
        return any(not b.models for b in self._all)

    def last_in_rotation(self, b: Backend) -> bool:
        """True when some model ``b`` serves has no other replica in rotation."""
        return any(not any(o.healthy for o in self.replicas(m) if o is not b) for m in b.models)

    def servable(self, model: str) -> bool:
        return any(b.servable for b in self.replicas(model))
