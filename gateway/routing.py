"""Routing policies: which in-rotation replica of a model takes a request. Selectable per model.

- ``round_robin``: in turn, blind to load. With several gateway workers the turn is the gateway's
  (shared.turn_counter), and so is a tie's turn under the other policies.
- ``least_in_flight``: fewest requests open from this gateway (every worker's, pool.Count); ties
  in turn. The default.
- ``load_aware``: lowest ``load_score`` (loadscrape.py): the gateway's in-flight count plus what
  the replica's own /metrics says (requests from elsewhere, its queue, KV-cache use); ties in turn.
- ``prefix_aware``: affinity first, load second. A request with a session key (the session
  header, else the body's ``user``) goes to its replica on a consistent-hash ring; any other goes
  to the replica that was sent the longest prefix of its prompt (prefix.py). Either way a replica
  whose load is above ``affinity_load_factor`` × the average (bounded loads) is passed over, so
  no replica is overloaded for the sake of affinity; then, and when nothing matches, the
  load-aware choice. The prefix is recorded for whichever replica is chosen.

  With several gateway workers the index is one table that they all map (prefixshare.py): what
  any worker sent where, every worker finds, so the workers route as one gateway would, and every
  turn of a conversation goes where its history is whichever workers take them. (Before the
  table, each worker learned alone, and a chat's opening went on the ring instead: measured equal,
  bench/README.md "Prefix-aware routing with 4 gateway workers".)

Each choice returns a reason, counted in ``fleet_routing_decisions_total``.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fleetspec.policies import Policy
from gateway.backend import Backend
from gateway.load import load_estimate, load_score
from gateway.prefix import HashRing, Index, PrefixIndex, block_hashes, prompt_text

# Reasons, the metric's label values.
BALANCED = "balanced"  # the policy's load (or turn) based choice
PREFIX_MATCH = "prefix_match"
PREFIX_MISS = "prefix_miss"  # prefix-aware, no replica holds any of the prompt: balanced
SESSION = "session"
OVERLOADED = "affinity_overloaded"  # the affinity replica was over the bound: balanced instead


@dataclass(frozen=True, slots=True)
class Hint:
    """What prefix-aware routing knows of one request."""

    session: str | None
    blocks: list[int]


def hint_for(doc: dict[str, Any], session: str | None) -> Hint:
    if session is None:
        user = doc.get("user")
        session = user if isinstance(user, str) and user else None
    if session:
        return Hint(session, [])
    return Hint(None, block_hashes(prompt_text(doc)))


class Router:
    """The routing state of one model: its policy, turn counter, prefix index and ring."""

    def __init__(self, policy: Policy, load_factor: float, index_capacity: int, max_age: float,
                 shared_index: Index | None = None, turn: Callable[[], int] | None = None) -> None:
        """``shared_index``: the workers' (prefixshare.py), used instead of an index of its own;
        ``turn``: the workers' turn counter (shared.turn_counter), used instead of its own."""
        self.policy = policy
        self.label = policy.value  # the decision metric's label, per request (an enum's .value is a Python descriptor)
        self.load_factor = load_factor
        self.max_age = max_age
        self._turn = turn or itertools.count().__next__
        self.index: Index | None = None
        if policy is Policy.PREFIX_AWARE:
            self.index = shared_index if shared_index is not None else PrefixIndex(index_capacity)
        self._ring: HashRing | None = None
        self._ring_of: tuple[Backend, ...] = ()

    def choose(self, group: Sequence[Backend], usable: Sequence[Backend], hint: Hint | None,
               count: Callable[[Backend], int]) -> tuple[Backend, str]:
        """``usable``: the in-rotation, not excluded members of ``group``; never empty. ``count``:
        the requests the whole gateway has open to a backend."""
        if self.policy is Policy.ROUND_ROBIN:
            return usable[self._turn() % len(usable)], BALANCED
        if self.policy is Policy.LEAST_IN_FLIGHT:
            return self._least(usable, lambda b: float(count(b))), BALANCED
        now = time.monotonic()
        if self.policy is Policy.LOAD_AWARE or hint is None:
            return self._least(usable, lambda b: load_score(b, count(b), now, self.max_age)), BALANCED
        return self._affine(group, usable, hint, now, count)

    def _least(self, usable: Sequence[Backend], score: Callable[[Backend], float]) -> Backend:
        if len(usable) == 1:
            return usable[0]
        scores = [score(b) for b in usable]  # once each: a load score reads the scrape and the clock
        best = min(scores)
        ties = [b for b, x in zip(usable, scores, strict=True) if x == best]
        return ties[0] if len(ties) == 1 else ties[self._turn() % len(ties)]

    def _affine(self, group: Sequence[Backend], usable: Sequence[Backend], hint: Hint,
                now: float, count: Callable[[Backend], int]) -> tuple[Backend, str]:
        counts = {id(b): count(b) for b in usable}  # once each: with workers a count sums the table
        loads = {id(b): load_estimate(b, counts[id(b)], now, self.max_age) for b in usable}

        def score(b: Backend) -> float:
            return load_score(b, counts[id(b)], now, self.max_age)

        # Bounded loads: a replica may take this request if it would then hold at most
        # load_factor × the average load (this request included), rounded up.
        bound = math.ceil(self.load_factor * (sum(loads.values()) + 1) / len(usable))

        def fits(b: Backend) -> bool:
            load = loads.get(id(b))
            return load is not None and load + 1 <= bound

        def on_ring(key: str, reason: str) -> tuple[Backend | None, str]:
            for b in self._ring_for(group).walk(key):
                if fits(b):
                    return b, reason
                if id(b) in loads:  # usable, but over the bound: its next on the ring takes it
                    reason = OVERLOADED
            return None, reason

        chosen: Backend | None = None
        reason = BALANCED
        if hint.session is not None:
            chosen, reason = on_ring(hint.session, SESSION)
        else:
            assert self.index is not None
            depth, holders = self.index.deepest(hint.blocks, usable)
            fitting = [b for b in holders if fits(b)]
            if fitting:
                chosen = self._least(fitting, score)
                reason = PREFIX_MATCH
            elif hint.blocks:
                reason = OVERLOADED if depth else PREFIX_MISS
        if chosen is None:  # no affinity, or no affinity replica within the bound
            chosen = self._least(usable, score)
        if self.index is not None and hint.blocks:
            self.index.record(hint.blocks, chosen)
        return chosen, reason

    def _ring_for(self, group: Sequence[Backend]) -> HashRing:
        # Built over every replica of the model, in rotation or not, so that a replica leaving
        # rotation moves only its own keys (the walk passes over it).
        if self._ring is None or tuple(group) != self._ring_of:
            self._ring_of = tuple(group)
            self._ring = HashRing(group)
        return self._ring

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"policy": self.policy.value}
        if self.index is not None:
            out["prefix_index_blocks"] = len(self.index)
            out["affinity_load_factor"] = self.load_factor
        return out
