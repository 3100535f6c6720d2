"""Which backend serves a model: replicas by served name, chosen by the model's routing policy
(routing.py; least in-flight unless configured otherwise)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from fleetspec.policies import Policy
from fleetspec.tiers import VramTier, largest_tier
from gateway.backend import Backend
from gateway.routing import Hint, Router

# Told of every routing decision: model, policy, reason (the metric's labels).
DecisionHook = Callable[[str, str, str], None]


def _default_router(_: str) -> Router:
    return Router(Policy.LEAST_IN_FLIGHT, 1.0, 0, 0.0)


class BackendPool:
    def __init__(self, backends: list[Backend], node_tier: VramTier | None,
                 router_for: Callable[[str], Router] = _default_router,
                 on_decision: DecisionHook | None = None) -> None:
        self.backends = backends
        self._tier_override = node_tier
        self._by_model: dict[str, list[Backend]] = {}
        self._router_for = router_for
        self.routers: dict[str, Router] = {}
        self.on_decision = on_decision
        self.reindex()

    def reindex(self) -> None:
        """Rebuild the model map; called when a backend's model list changes."""
        by_model: dict[str, list[Backend]] = {}
        for b in self.backends:
            for m in b.models:
                by_model.setdefault(m, []).append(b)
        self._by_model = by_model
        for m in by_model:
            if m not in self.routers:
                self.routers[m] = self._router_for(m)

    def knows(self, model: str) -> bool:
        return model in self._by_model

    @property
    def discovering(self) -> bool:
        """Some backend's models are still unknown, so an unknown name may yet appear."""
        return any(not b.models for b in self.backends)

    def replicas(self, model: str) -> int:
        return len(self._by_model.get(model, ()))

    def last_in_rotation(self, b: Backend) -> bool:
        """True when some model ``b`` serves has no other replica in rotation."""
        return any(not any(o.healthy for o in self._by_model.get(m, ()) if o is not b) for m in b.models)

    def served_models(self) -> list[str]:
        return sorted(self._by_model)

    def pick(self, model: str, exclude: Iterable[Backend] = (), hint: Hint | None = None) -> Backend | None:
        """The replica of ``model`` its policy chooses among those in rotation, or None."""
        group = self._by_model.get(model)
        if not group:
            return None
        usable = [b for b in group if b.healthy and b not in exclude]
        if not usable:
            return None
        router = self.routers[model]
        b, reason = router.choose(group, usable, hint)
        if self.on_decision is not None:
            self.on_decision(model, router.policy.value, reason)
        return b

    def affine(self, model: str) -> bool:
        """The model's policy routes by prompt prefix or session, so requests need a ``Hint``."""
        return self.routers[model].policy is Policy.PREFIX_AWARE

    def has_other(self, model: str, exclude: Iterable[Backend]) -> bool:
        """Some replica of ``model`` outside ``exclude`` is in rotation (no decision is made)."""
        return any(b.healthy and b not in exclude for b in self._by_model.get(model, ()))

    def least_busy(self, model: str, exclude: Iterable[Backend], limit: int) -> Backend | None:
        """The replica in rotation with the fewest in-flight requests, if it has fewer than ``limit``."""
        free = [b for b in self._by_model.get(model, ()) if b.healthy and b not in exclude and b.in_flight < limit]
        return min(free, key=lambda b: b.in_flight) if free else None

    def forget(self, b: Backend) -> None:
        """``b`` left rotation as unhealthy: its KV cache may be gone, drop it from prefix indexes."""
        for r in self.routers.values():
            if r.index is not None:
                r.index.forget(b)

    def node_tier(self) -> VramTier:
        return self._tier_override or largest_tier(b.vram_tier for b in self.backends)

    def models_list(self) -> dict[str, Any]:
        """OpenAI list shape: the union of what healthy backends serve."""
        seen: dict[str, dict[str, Any]] = {}
        for b in self.backends:
            if not b.healthy:
                continue
            for m in b.models:
                if m not in seen:
                    seen[m] = b.cards.get(m) or {"id": m, "object": "model", "created": 0, "owned_by": "vllm-fleet"}
        return {"object": "list", "data": list(seen.values())}

    def ready(self) -> bool:
        return any(b.healthy for b in self.backends)
