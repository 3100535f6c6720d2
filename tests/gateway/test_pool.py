"""Replica choice and health-state transitions, without sockets."""

from __future__ import annotations

import collections

from fleetspec.tiers import VramTier
from gateway.backend import Backend, BackendSet
from gateway.pool import BackendPool
from gateway.state import BackendState as S


def _b(name: str, models: list[str], healthy: bool = True) -> Backend:
    b = Backend(name, f"http://{name}", VramTier.UNKNOWN, models, list(models))
    b.state = S.HEALTHY if healthy else S.UNHEALTHY
    return b


def test_fewest_in_flight_wins() -> None:
    a, b, c = _b("a", ["m"]), _b("b", ["m"]), _b("c", ["m"])
    pool = BackendPool(BackendSet([a, b, c]), None)
    a.in_flight, b.in_flight, c.in_flight = 3, 1, 2
    assert {pool.pick("m") for _ in range(10)} == {b}


def test_ties_round_robin_and_unhealthy_skipped() -> None:
    a, b, c = _b("a", ["m"]), _b("b", ["m"]), _b("c", ["m"], healthy=False)
    pool = BackendPool(BackendSet([a, b, c]), None)
    picks = collections.Counter(pool.pick("m").name for _ in range(10))  # type: ignore[union-attr]
    assert picks == {"a": 5, "b": 5}
    assert pool.pick("m", exclude=[a, b]) is None
    assert pool.pick("other") is None


def test_models_list_is_union_of_healthy() -> None:
    pool = BackendPool(BackendSet([_b("a", ["x", "y"]), _b("b", ["y", "z"]), _b("c", ["w"], healthy=False)]), None)
    assert [m["id"] for m in pool.models_list()["data"]] == ["x", "y", "z"]
    assert pool.served_models() == ["w", "x", "y", "z"]


def test_probe_transitions() -> None:
    b = Backend("a", "http://a", VramTier.UNKNOWN, [], [])
    assert b.state == S.UNKNOWN
    assert b.record_probe(True, None, failures=3, successes=2) and b.state == S.HEALTHY  # first success suffices
    assert not b.record_probe(False, "x", 3, 2) and not b.record_probe(False, "x", 3, 2)
    assert b.healthy  # two failures < three
    assert b.record_probe(False, "boom", 3, 2) and b.state == S.UNHEALTHY and b.last_error == "boom"
    assert not b.record_probe(True, None, 3, 2) and b.state == S.UNHEALTHY  # one success < two
    assert b.record_probe(True, None, 3, 2) and b.state == S.HEALTHY


def test_node_tier_override_and_largest() -> None:
    a = _b("a", ["m"])
    a.vram_tier = VramTier.GB_16_24
    assert BackendPool(BackendSet([a]), None).node_tier() == VramTier.GB_16_24
    assert BackendPool(BackendSet([a]), VramTier.GE_48GB).node_tier() == VramTier.GE_48GB
