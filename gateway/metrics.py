"""Gateway metrics (DESIGN §2), on a registry of the app's own, with bounded labels.

``model`` is always a name some backend serves, or ``unknown``; ``backend`` is a configured
backend name, or ``none`` when the request never reached one. Label children are cached because
``labels()`` takes a lock and formats a key on every call, and this runs per request.

With several workers (``FLEET_WORKERS``) prometheus_client runs in its multiprocess mode (the
parent sets ``PROMETHEUS_MULTIPROC_DIR`` before the workers start): every process writes its values
to files there and ``render()`` reads them all, so a scrape of any worker shows the whole gateway.
Counters and histograms add up, dead workers' counts included (they happened); gauges say how
to combine: in-flight and queue depth are summed over live workers, healthy is the max over live
workers (in rotation in at least one of them). With one worker nothing of this runs.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, values
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from gateway.activity import CURRENT, Activity
from gateway.state import BackendState
from gateway.tally import Tally

if TYPE_CHECKING:
    from gateway.backend import Backend, BackendSet

UNKNOWN_MODEL = "unknown"
NO_BACKEND = "none"

_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)
_TTFB_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# A splice costs a continuation's time to first token (prefill of the prompt and the text so far).
_SPLICE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_CONNECTION_STATES = ("open", "idle")  # fleet_upstream_connections' state label; upstream.py's counts keys


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # The console's recent requests and per-model charts: filled by count() and observe_ttfb().
        self.activity = Activity()
        r = self.registry
        self.requests = Counter("fleet_requests_total", "Requests answered, by model, backend and status code",
                                ["model", "backend", "code"], registry=r)
        self.duration = Histogram("fleet_request_duration_seconds", "Whole request time, first byte in to last out",
                                  ["model"], buckets=_DURATION_BUCKETS, registry=r)
        self.ttfb = Histogram("fleet_time_to_first_byte_seconds", "Request in to first response body byte out",
                              ["model"], buckets=_TTFB_BUCKETS, registry=r)
        self.healthy = Gauge("fleet_backend_healthy", "1 while the backend is in rotation", ["backend"], registry=r,
                             multiprocess_mode="livemax")
        self.state = Gauge("fleet_backend_state", "1 for the state the gateway sees the backend in: unknown, healthy, "
                           "unhealthy, ejected, asleep, draining", ["backend", "state"], registry=r,
                           multiprocess_mode="livemax")
        self.in_flight = Gauge("fleet_backend_in_flight", "Requests the gateway has open to the backend",
                               ["backend"], registry=r, multiprocess_mode="livesum")
        # Set at each probe, not per request: the pool changes on the hot path, a scrape can lag it.
        self.connections = Gauge("fleet_upstream_connections", "Connections the gateway holds open to the backend, "
                                 "as of its last probe: open (idle or busy), and of those idle", ["backend", "state"],
                                 registry=r, multiprocess_mode="livesum")
        # Set by the load scraper (load_aware, prefix_aware) as each scrape is judged (load.py settle).
        self.load_stalled = Gauge("fleet_backend_load_stalled", "1 while the backend's /metrics says requests run or "
                                  "wait but its token counters have not moved for 5 scrapes: load routing counts only "
                                  "the gateway's own requests there (as of the last scrape)", ["backend"],
                                  registry=r, multiprocess_mode="livemax")
        self.retries = Counter("fleet_retries_total", "Requests sent again to another replica before any byte",
                               ["model"], registry=r)
        self.upstream_failures = Counter("fleet_upstream_failures_total",
                                         "Upstream failures by phase: connect, headers, stream",
                                         ["backend", "phase"], registry=r)
        self.probes = Counter("fleet_health_probes_total", "Active /health probes by result",
                              ["backend", "result"], registry=r)
        self.ejections = Counter("fleet_backend_ejections_total",
                                 "Times the backend left rotation after failed requests in a row",
                                 ["backend"], registry=r)
        self.rejected = Counter("fleet_rejected_total",
                                "Requests refused with 429 by backpressure: queue_full, queue_timeout, max_in_flight",
                                ["reason"], registry=r)
        self.queue_depth = Gauge("fleet_queue_depth", "Requests waiting for a free replica of the model",
                                 ["model"], registry=r, multiprocess_mode="livesum")
        # Only requests that queued are observed (the rest waited 0): its count says how many queued.
        self.queue_wait = Histogram("fleet_queue_wait_seconds",
                                    "Time a request waited in the gateway's queue for a free (or waking) replica",
                                    ["model"], buckets=_TTFB_BUCKETS, registry=r)
        self.workers = Gauge("fleet_gateway_workers", "Gateway worker processes alive", registry=r,
                             multiprocess_mode="livesum")
        self.workers.set(1)
        # Decided by prometheus_client when it was imported, from the environment; follow it.
        files = values.ValueClass is not values.MutexValue
        self._mp_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") if files else None
        self._mp_registry: CollectorRegistry | None = None
        if self._mp_dir:
            self._mp_registry = CollectorRegistry()
            MultiProcessCollector(self._mp_registry, self._mp_dir)  # type: ignore[no-untyped-call]
        self.routing = Counter("fleet_routing_decisions_total",
                               "Replica choices by model, policy and reason: balanced, prefix_match, prefix_miss, "
                               "session, affinity_overloaded", ["model", "policy", "reason"], registry=r)
        self.migrations = Counter("fleet_stream_migrations_total",
                                  "Streams whose replica broke after the first byte, by what became of them: migrated, "
                                  "finished, or why they ended with the error event (docs/stream-failover.md)",
                                  ["model", "outcome"], registry=r)
        self.splice_gap = Histogram("fleet_stream_splice_gap_seconds",
                                    "Break of a stream's replica seen -> first byte of its continuation to the client",
                                    ["model"], buckets=_SPLICE_BUCKETS, registry=r)
        self.splice_overhead = Histogram("fleet_stream_splice_overhead_seconds",
                                         "The gateway's share of the splice gap: break seen -> continuation sent",
                                         ["model"], buckets=_SPLICE_BUCKETS, registry=r)
        self.tally = Tally(each_turn=self._mp_dir is not None)  # the request path's updates, batched
        self._req: dict[tuple[str, str, int | str], Counter] = {}
        self._dur: dict[str, Histogram] = {}
        self._ttfb: dict[str, Histogram] = {}
        self._in_flight: dict[str, Gauge] = {}
        self._routing: dict[tuple[str, str, str], Counter] = {}

    def watch(self, backends: BackendSet) -> None:
        """Follow every backend's state (docs/architecture.md §2: metrics are a subscriber)."""
        for b in backends:
            self._backend_changed(b, None, b.state)
        backends.subscribe(self._backend_changed)

    def set_load_stalled(self, backend: str, stalled: bool) -> None:
        self.load_stalled.labels(backend).set(1 if stalled else 0)

    def _backend_changed(self, b: Backend, old: BackendState | None, new: BackendState | None) -> None:
        if new is None:  # removed by a reload: its live series go with it
            with contextlib.suppress(KeyError):
                self.healthy.remove(b.name)
            for s in BackendState:
                with contextlib.suppress(KeyError):
                    self.state.remove(b.name, s.value)
            for kind in _CONNECTION_STATES:
                with contextlib.suppress(KeyError):
                    self.connections.remove(b.name, kind)
            with contextlib.suppress(KeyError):
                self.load_stalled.remove(b.name)
            return
        self.healthy.labels(b.name).set(1 if b.healthy else 0)
        for s in BackendState:
            self.state.labels(b.name, s.value).set(1 if s is new else 0)

    def count_probe(self, backend: str, ok: bool) -> None:
        self.probes.labels(backend, "ok" if ok else "fail").inc()

    def upstream_connections(self, backend: str, counts: dict[str, int]) -> None:
        """This process's connections to ``backend`` (upstream.py's ``counts``: open, idle)."""
        for kind in _CONNECTION_STATES:
            self.connections.labels(backend, kind).set(counts[kind])

    def count(self, model: str, backend: str, code: int | str) -> None:
        entry = CURRENT.get()
        if entry is not None:
            entry.model, entry.backend, entry.status = model, backend, code
        key = (model, backend, code)  # 200 and "200" are two keys of one child: the sums still add up
        child = self._req.get(key)
        if child is None:
            child = self._req[key] = self.requests.labels(model, backend, str(code))
        self.tally.inc(child)

    def decision(self, model: str, policy: str, reason: str) -> None:
        key = (model, policy, reason)
        child = self._routing.get(key)
        if child is None:
            child = self._routing[key] = self.routing.labels(*key)
        self.tally.inc(child)

    def observe_duration(self, model: str, seconds: float) -> None:
        child = self._dur.get(model)
        if child is None:
            child = self._dur[model] = self.duration.labels(model)
        self.tally.observe(child, seconds)

    def observe_ttfb(self, model: str, seconds: float) -> None:
        entry = CURRENT.get()
        if entry is not None:
            entry.ttfb = seconds
        child = self._ttfb.get(model)
        if child is None:
            child = self._ttfb[model] = self.ttfb.labels(model)
        self.tally.observe(child, seconds)

    def backend_in_flight(self, backend: str, n: int) -> None:
        """This process's requests open to ``backend`` are now ``n``."""
        child = self._in_flight.get(backend)
        if child is None:
            child = self._in_flight[backend] = self.in_flight.labels(backend)
        self.tally.set(child, n)

    def render(self) -> bytes:
        self.tally.flush()
        if self._mp_registry is None or self._mp_dir is None:
            return generate_latest(self.registry)
        _forget_dead(self._mp_dir)
        return generate_latest(self._mp_registry)


_LIVE_FILE = re.compile(r"gauge_live\w+_(\d+)\.db$")


def _forget_dead(directory: str) -> None:
    """Drop the live-gauge files of workers that are gone (crashed and replaced by uvicorn, or
    stopped), so their last in-flight and health values stop counting. Once per scrape: cheap."""
    for path in glob.glob(os.path.join(directory, "gauge_live*_*.db")):
        m = _LIVE_FILE.search(path)
        if m is None:
            continue
        pid = int(m.group(1))
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]
        except PermissionError:
            pass  # alive, someone else's
