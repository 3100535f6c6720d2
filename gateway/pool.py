"""Which backend serves a model: replicas by served name (the backend set's index), chosen by the
model's routing policy (routing.py; least in-flight unless configured otherwise).

A reader of backend state (docs/architecture.md §2). It subscribes to the backend set for one
thing: a backend that left rotation because it went down, went to sleep or was removed may have
lost its KV cache, so the prefix indexes forget it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from fleetspec.policies import Policy
from fleetspec.tiers import VramTier, largest_tier
from gateway.backend import Backend, BackendSet
from gateway.routing import Hint, Router
from gateway.shared import FAILURES, SharedCounts, gateway_total, in_flight_counter
from gateway.state import BackendState

# Told of every routing decision: model, policy, reason (the metric's labels).
DecisionHook = Callable[[str, str, str], None]
# Requests open to a backend from the whole gateway: with several workers, every worker's (the
# shared table), so that workers balance the gateway's load, not each their own share.
Count = Callable[[Backend], int]
# Leaving rotation for one of these (None: removed from the set) may have emptied the KV cache.
_CACHE_LOST = frozenset({BackendState.UNHEALTHY, BackendState.ASLEEP, None})


def _default_router(_: str) -> Router:
    return Router(Policy.LEAST_IN_FLIGHT, 1.0, 0, 0.0)


class BackendPool:
    def __init__(self, backends: BackendSet, node_tier: VramTier | None,
                 router_for: Callable[[str], Router] = _default_router,
                 on_decision: DecisionHook | None = None, shared: SharedCounts | None = None) -> None:
        self.backends = backends
        self.shared = shared  # the workers' table (shared.py), also the limiter's
        self.count: Count = in_flight_counter(shared)
        self._tier_override = node_tier
        self._router_for = router_for
        self.routers: dict[str, Router] = {}
        self.on_decision = on_decision
        backends.subscribe(self._changed)

    def _changed(self, b: Backend, old: BackendState | None, new: BackendState | None) -> None:
        if old is not None and new in _CACHE_LOST:
            for r in self.routers.values():
                if r.index is not None:
                    r.index.forget(b)

    def router(self, model: str) -> Router:
        r = self.routers.get(model)
        if r is None:
            r = self.routers[model] = self._router_for(model)
        return r

    def knows(self, model: str) -> bool:
        return self.backends.knows(model)

    @property
    def discovering(self) -> bool:
        return self.backends.discovering

    def replicas(self, model: str) -> int:
        return len(self.backends.replicas(model))

    def served_models(self) -> list[str]:
        return self.backends.served_models()

    def pick(self, model: str, exclude: Iterable[Backend] = (), hint: Hint | None = None) -> Backend | None:
        """The replica of ``model`` its policy chooses among those in rotation, or None."""
        group = self.backends.replicas(model)
        if not group:
            return None
        usable = [b for b in group if b.healthy and b not in exclude]
        if not usable:
            return None
        router = self.router(model)
        b, reason = router.choose(group, usable, hint, self.count)
        if self.on_decision is not None:
            self.on_decision(model, router.label, reason)
        return b

    def affine(self, model: str) -> bool:
        """The model's policy routes by prompt prefix or session, so requests need a ``Hint``."""
        return self.router(model).policy is Policy.PREFIX_AWARE

    def has_other(self, model: str, exclude: Iterable[Backend]) -> bool:
        """Some replica of ``model`` outside ``exclude`` is in rotation (no decision is made)."""
        return any(b.healthy and b not in exclude for b in self.backends.replicas(model))

    def other(self, model: str, exclude: Iterable[Backend]) -> Backend | None:
        """Some replica of ``model`` in rotation outside ``exclude``, the least busy (no decision is
        counted: for a side request such as a token count, not for routing)."""
        usable = [b for b in self.backends.replicas(model) if b.healthy and b not in exclude]
        return min(usable, key=self.count) if usable else None

    def least_busy(self, model: str, exclude: Iterable[Backend],
                   has_room: Callable[[Backend], bool]) -> Backend | None:
        """The replica in rotation with the fewest in-flight requests among those with room."""
        free = [b for b in self.backends.replicas(model) if b.healthy and b not in exclude and has_room(b)]
        return min(free, key=self.count) if free else None

    def describe(self, b: Backend) -> dict[str, Any]:
        """``b`` for /fleet and the console, its counts the whole gateway's: requests in flight and
        failed requests in a row (what passive ejection compares with ``eject_failures``)."""
        return b.describe(self.count(b), gateway_total(self.shared, b, b.request_failures, FAILURES))

    def node_tier(self) -> VramTier:
        return self._tier_override or largest_tier(b.vram_tier for b in self.backends)

    def models_list(self) -> dict[str, Any]:
        """OpenAI list shape: the union of what servable backends serve (asleep ones included: a
        request for them wakes them)."""
        seen: dict[str, dict[str, Any]] = {}
        for b in self.backends:
            if not b.servable:
                continue
            for m in b.models:
                card = seen.get(m)
                if card is None:
                    card = seen[m] = {**(b.cards.get(m) or {"id": m, "object": "model", "created": 0,
                                                             "owned_by": "vllm-fleet"}), "state": "asleep"}
                if b.healthy:
                    card["state"] = "awake"
        return {"object": "list", "data": list(seen.values())}

    def unready_models(self) -> list[str]:
        """Served names without a servable replica. Empty, and at least one name known: ready."""
        return [m for m in self.backends.served_models() if not self.backends.servable(m)]

    def ready(self) -> bool:
        return bool(self.backends.served_models()) and not self.backends.discovering and not self.unready_models()

    def routing(self) -> dict[str, Any]:
        return {m: self.router(m).describe() for m in self.backends.served_models()}
