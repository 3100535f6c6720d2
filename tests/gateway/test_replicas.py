"""Replicas of one model: fewest in-flight wins, ties go round-robin, and a stopped replica leaves
rotation within the probe window without failing a request, then comes back when restarted."""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.procs import FakeVllm, Gateway, instances, wait_until


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[FakeVllm, FakeVllm, Gateway]]:
    a = FakeVllm(tmp_path, ["m"])
    b = FakeVllm(tmp_path, ["m"])
    gw = None
    try:
        gw = Gateway(tmp_path, instances(a, b))
        assert wait_until(lambda: all(x["healthy"] for x in httpx.get(gw.url + "/fleet").json()["backends"]))
        yield a, b, gw
    finally:
        if gw is not None:
            gw.stop()
        a.stop()
        b.stop()


def _backend_of(gw: Gateway) -> str:
    r = httpx.post(gw.url + "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1}, timeout=10)
    assert r.status_code == 200, r.text
    return r.headers["x-fake-backend"]


def test_least_in_flight_then_round_robin(pair: tuple[FakeVllm, FakeVllm, Gateway]) -> None:
    a, b, gw = pair
    for f in (a, b):
        f.configure(token_delay=0.05)
    # Hold one stream open: its replica has 1 in flight, the other 0.
    opened = threading.Event()
    release = threading.Event()
    holder: list[str] = []

    def hold() -> None:
        with httpx.stream("POST", gw.url + "/v1/completions", timeout=30,
                          json={"model": "m", "prompt": "x", "max_tokens": 600, "stream": True}) as r:
            holder.append(r.headers["x-fake-backend"])
            opened.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert opened.wait(10)
        picks = collections.Counter(_backend_of(gw) for _ in range(6))
        assert holder[0] not in picks, (holder, picks)  # all six avoided the busy replica
        assert sum(picks.values()) == 6
    finally:
        release.set()
        t.join(30)
    assert wait_until(lambda: all(x["in_flight"] == 0 for x in httpx.get(gw.url + "/fleet").json()["backends"]))
    picks = collections.Counter(_backend_of(gw) for _ in range(6))
    assert picks == {f"fake-{a.port}": 3, f"fake-{b.port}": 3}, picks


def test_stopped_replica_leaves_rotation_and_returns(pair: tuple[FakeVllm, FakeVllm, Gateway]) -> None:
    a, b, gw = pair
    a.stop()
    # During the probe window requests still succeed: a refused connect moves to the other replica.
    served = [_backend_of(gw) for _ in range(20)]
    assert set(served) == {f"fake-{b.port}"}

    def state(f: FakeVllm) -> str:
        return next(str(x["state"]) for x in httpx.get(gw.url + "/fleet").json()["backends"] if x["url"] == f.url)

    assert wait_until(lambda: state(a) == "unhealthy", timeout=5)
    metrics = httpx.get(gw.url + "/metrics").text
    assert f'fleet_backend_healthy{{backend="fake-{a.port}"}} 0.0' in metrics
    assert 'fleet_retries_total{model="m"}' in metrics
    a.restart()
    assert wait_until(lambda: state(a) == "healthy", timeout=5)
    assert {_backend_of(gw) for _ in range(4)} == {f"fake-{a.port}", f"fake-{b.port}"}
