"""Which backend serves a model: replicas by served name, fewest in-flight wins, ties round-robin."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

from fleetspec.tiers import VramTier, largest_tier
from gateway.backend import Backend


class BackendPool:
    def __init__(self, backends: list[Backend], node_tier: VramTier | None) -> None:
        self.backends = backends
        self._tier_override = node_tier
        self._by_model: dict[str, list[Backend]] = {}
        self._rr: dict[str, itertools.count[int]] = {}
        self.reindex()

    def reindex(self) -> None:
        """Rebuild the model map; called when a backend's model list changes."""
        by_model: dict[str, list[Backend]] = {}
        for b in self.backends:
            for m in b.models:
                by_model.setdefault(m, []).append(b)
        self._by_model = by_model
        for m in by_model:
            self._rr.setdefault(m, itertools.count())

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

    def pick(self, model: str, exclude: Iterable[Backend] = ()) -> Backend | None:
        """A healthy replica of ``model`` with the fewest in-flight requests, or None."""
        group = self._by_model.get(model)
        if not group:
            return None
        ties: list[Backend] = []
        best = -1
        for b in group:
            if not b.healthy or b in exclude:
                continue
            if best < 0 or b.in_flight < best:
                best, ties = b.in_flight, [b]
            elif b.in_flight == best:
                ties.append(b)
        if not ties:
            return None
        if len(ties) == 1:
            return ties[0]
        return ties[next(self._rr[model]) % len(ties)]

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
