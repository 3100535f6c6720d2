"""The supervisor's Prometheus metrics, in a registry of their own.

A private CollectorRegistry keeps two fleets in one test process (or the gateway, if it ever ran
in-process) from colliding on the global one, and keeps the endpoint free of process metrics that
belong to whoever scrapes the supervisor's host anyway.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

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
        for name in names:
            # Every series exists from the start, so a FATAL-at-once instance is still visible
            # and rate() over restarts has a zero to start from.
            self.set_state(name, State.STOPPED)
            self.restarts.labels(instance=name)

    def set_state(self, name: str, state: State) -> None:
        for s in State:
            self.state.labels(instance=name, state=s.value).set(1 if s is state else 0)

    def count_restart(self, name: str) -> None:
        self.restarts.labels(instance=name).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
