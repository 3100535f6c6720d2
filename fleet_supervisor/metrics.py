"""The supervisor's Prometheus metrics, in a registry of their own.

A private CollectorRegistry keeps two fleets in one test process (or the gateway, if it ever ran
in-process) from colliding on the global one, and keeps the endpoint free of process metrics that
belong to whoever scrapes the supervisor's host anyway.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from fleet_supervisor.state import State


class FleetMetrics:
    def __init__(self, names: Iterable[str]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.state = Gauge(
            "fleet_instance_state", "1 for the state each supervised child is in, 0 for the others",
            ["instance", "state"], registry=self.registry,
        )
        self.restarts = Counter(
            "fleet_instance_restarts_total", "Restarts of each supervised child after a failure",
            ["instance"], registry=self.registry,
        )
        self.sleeping = Gauge(
            "fleet_instance_sleeping", "1 while the instance sleeps (its memory given back), else 0",
            ["instance"], registry=self.registry,
        )
        self.wake_seconds = Histogram(
            "fleet_wake_seconds", "From a wake being asked to the instance RUNNING again, by mode (vllm, cold)",
            ["instance", "mode"], registry=self.registry,
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600),
        )
        self.swaps = Counter(
            "fleet_swaps_total", "Instances asked to sleep, by reason: swap (another model needs the memory), "
            "idle, startup, admin", ["reason"], registry=self.registry,
        )
        for name in names:
            self.track(name)
        for reason in ("swap", "idle", "startup", "admin"):
            self.swaps.labels(reason=reason)

    def track(self, name: str) -> None:
        # Every series exists from the start, so a FATAL-at-once instance is still visible
        # and rate() over restarts has a zero to start from.
        self.set_state(name, State.STOPPED)
        self.restarts.labels(instance=name)

    def set_state(self, name: str, state: State) -> None:
        for s in State:
            self.state.labels(instance=name, state=s.value).set(1 if s is state else 0)
        self.sleeping.labels(instance=name).set(1 if state is State.SLEEPING else 0)

    def observe_wake(self, name: str, mode: str, seconds: float) -> None:
        self.wake_seconds.labels(instance=name, mode=mode).observe(seconds)

    def count_swap(self, reason: str) -> None:
        self.swaps.labels(reason=reason).inc()

    def count_restart(self, name: str) -> None:
        self.restarts.labels(instance=name).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
