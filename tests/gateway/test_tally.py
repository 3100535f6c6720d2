"""Tally: the request path's metric updates, handed to prometheus_client once per loop turn."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gateway.metrics import GatewayMetrics
from gateway.tally import Tally

BUCKETS = (0.005, 0.01, 0.5, 1, 10)
# On a bound, between bounds, below the first, above the last (+Inf), zero, repeated.
VALUES = (0.005, 0.0051, 0.001, 11.0, 0.0, 0.5, 0.5, 1.0, 9.99, 0.01)


def _metrics(r: CollectorRegistry) -> tuple[Counter, Histogram, Gauge]:
    return (Counter("c_total", "c", ["k"], registry=r), Histogram("h", "h", ["k"], buckets=BUCKETS, registry=r),
            Gauge("g", "g", ["k"], registry=r))


def _samples(r: CollectorRegistry) -> list[str]:
    # Every sample but the series' creation times, which differ between the two registries.
    return [line for line in generate_latest(r).decode().splitlines() if "_created" not in line]


def test_batched_updates_render_as_prometheus_clients_own() -> None:
    direct, batched = CollectorRegistry(), CollectorRegistry()
    c1, h1, g1 = _metrics(direct)
    c2, h2, g2 = _metrics(batched)
    tally = Tally(each_turn=True)

    async def updates() -> None:
        for i, v in enumerate(VALUES):
            key = "a" if i % 3 else "b"
            c1.labels(key).inc()
            h1.labels(key).observe(v)
            g1.labels(key).set(i)
            tally.inc(c2.labels(key))
            tally.observe(h2.labels(key), v)
            tally.set(g2.labels(key), i)
        assert batched.get_sample_value("c_total", {"k": "a"}) == 0  # still this loop turn's
        await asyncio.sleep(0)

    asyncio.run(updates())
    assert _samples(batched) == _samples(direct)
    assert batched.get_sample_value("h_bucket", {"k": "a", "le": "+Inf"}) == 6


def test_outside_a_loop_an_update_is_handed_over_at_once() -> None:
    r = CollectorRegistry()
    c, h, _ = _metrics(r)
    tally = Tally(each_turn=True)
    tally.inc(c.labels("x"))
    tally.observe(h.labels("x"), 0.2)
    assert r.get_sample_value("c_total", {"k": "x"}) == 1
    assert r.get_sample_value("h_bucket", {"k": "x", "le": "0.5"}) == 1
    assert r.get_sample_value("h_sum", {"k": "x"}) == 0.2


def test_with_one_worker_nothing_is_handed_over_before_a_flush() -> None:
    r = CollectorRegistry()
    c, h, _ = _metrics(r)
    tally = Tally(each_turn=False)

    async def turns() -> None:
        tally.inc(c.labels("x"))
        tally.observe(h.labels("x"), 0.2)
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    asyncio.run(turns())
    assert r.get_sample_value("c_total", {"k": "x"}) == 0
    tally.flush()
    assert r.get_sample_value("c_total", {"k": "x"}) == 1
    assert r.get_sample_value("h_sum", {"k": "x"}) == 0.2


def test_a_render_in_the_same_turn_sees_every_update() -> None:
    m = GatewayMetrics()

    async def same_turn() -> bytes:
        m.count("m1", "b1", 200)
        m.observe_ttfb("m1", 0.02)
        m.observe_duration("m1", 0.3)
        m.backend_in_flight("b1", 3)
        return m.render()

    text = asyncio.run(same_turn()).decode()
    assert 'fleet_requests_total{backend="b1",code="200",model="m1"} 1.0' in text
    assert 'fleet_time_to_first_byte_seconds_bucket{le="0.025",model="m1"} 1.0' in text
    assert 'fleet_request_duration_seconds_count{model="m1"} 1.0' in text
    assert 'fleet_backend_in_flight{backend="b1"} 3.0' in text
