"""Backpressure: a replica at its concurrency limit makes requests wait in a bounded FIFO; a full
queue, a long wait or the gateway-wide cap answers 429 with Retry-After, quickly; a client that
leaves while queued leaves the queue."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.procs import FakeVllm, Gateway, instances, wait_until

LIMITS = {"FLEET_BACKEND_MAX_CONCURRENCY": "2", "FLEET_BACKEND_QUEUE": "2", "FLEET_QUEUE_TIMEOUT_S": "1.5"}


@pytest.fixture(scope="module")
def busy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeVllm, Gateway]]:
    tmp = tmp_path_factory.mktemp("backpressure")
    fake = FakeVllm(tmp, ["q"])
    gw = None
    try:
        gw = Gateway(tmp, instances(fake), env=LIMITS)
        yield fake, gw
    finally:
        if gw is not None:
            gw.stop()
        fake.stop()


class Requests:
    """Requests sent from threads, each answer (or exception) kept in order of submission."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.results: list[httpx.Response | Exception | None] = []
        self.threads: list[threading.Thread] = []

    def send(self, latency: float, timeout: float = 20) -> None:
        i = len(self.results)
        self.results.append(None)

        def run() -> None:
            try:
                self.results[i] = httpx.post(self.gw.url + "/v1/completions", timeout=timeout,
                                             json={"model": "q", "prompt": "x", "max_tokens": 1,
                                                   "fake_latency": latency})
            except Exception as e:
                self.results[i] = e

        t = threading.Thread(target=run)
        t.start()
        self.threads.append(t)

    def join(self) -> list[httpx.Response]:
        for t in self.threads:
            t.join(30)
        assert all(isinstance(r, httpx.Response) for r in self.results), self.results
        return [r for r in self.results if isinstance(r, httpx.Response)]


def _metric(gw: Gateway, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", httpx.get(gw.url + "/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


def _depth(gw: Gateway) -> float:
    return _metric(gw, 'fleet_queue_depth{model="q"}')


def test_full_replica_queues_then_serves(busy: tuple[FakeVllm, Gateway]) -> None:
    fake, gw = busy
    reqs = Requests(gw)
    reqs.send(0.8)
    reqs.send(0.8)
    assert wait_until(lambda: fake.stats()["in_flight"] == 2, timeout=5)
    reqs.send(0.0)
    assert wait_until(lambda: _depth(gw) == 1, timeout=5)
    assert fake.stats()["in_flight"] == 2  # the limit holds: the third waits in the gateway
    assert [r.status_code for r in reqs.join()] == [200, 200, 200]
    assert _depth(gw) == 0
    # Only the one that queued is observed, and it waited for a slot held ~0.8 s.
    assert _metric(gw, 'fleet_queue_wait_seconds_count{model="q"}') == 1
    assert _metric(gw, 'fleet_queue_wait_seconds_sum{model="q"}') > 0.3


def test_full_queue_is_429_quickly_and_long_waits_time_out(busy: tuple[FakeVllm, Gateway]) -> None:
    fake, gw = busy
    reqs = Requests(gw)
    for _ in range(2):
        reqs.send(3.0)
    assert wait_until(lambda: fake.stats()["in_flight"] == 2, timeout=5)
    for _ in range(2):
        reqs.send(0.0)
    assert wait_until(lambda: _depth(gw) == 2, timeout=5)
    t = time.monotonic()
    r = httpx.post(gw.url + "/v1/completions", json={"model": "q", "prompt": "x"}, timeout=10)
    assert time.monotonic() - t < 1.0
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "rate_limit_exceeded"
    # The two queued ones wait at most FLEET_QUEUE_TIMEOUT_S, then get 429 too.
    assert [x.status_code for x in reqs.join()] == [200, 200, 429, 429]
    assert _metric(gw, 'fleet_rejected_total{reason="queue_full"}') >= 1
    assert _metric(gw, 'fleet_rejected_total{reason="queue_timeout"}') >= 2
    assert _depth(gw) == 0


def test_client_that_disconnects_while_queued_leaves_the_queue(busy: tuple[FakeVllm, Gateway]) -> None:
    fake, gw = busy
    before = fake.stats()["requests_total"]
    reqs = Requests(gw)
    for _ in range(2):
        reqs.send(1.2)
    assert wait_until(lambda: fake.stats()["in_flight"] == 2, timeout=5)
    data = json.dumps({"model": "q", "prompt": "x"}).encode()
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=5)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    assert wait_until(lambda: _depth(gw) == 1, timeout=5)
    s.close()
    assert wait_until(lambda: _depth(gw) == 0, timeout=2)
    assert [r.status_code for r in reqs.join()] == [200, 200]
    assert fake.stats()["requests_total"] == before + 2  # the one that left never reached the backend


def test_gateway_wide_in_flight_cap_is_429(tmp_path: Path) -> None:
    fake = FakeVllm(tmp_path, ["q"])
    gw = Gateway(tmp_path, instances(fake), env={"FLEET_MAX_IN_FLIGHT": "1"})
    try:
        reqs = Requests(gw)
        reqs.send(1.0)
        assert wait_until(lambda: fake.stats()["in_flight"] == 1, timeout=5)
        r = httpx.post(gw.url + "/v1/completions", json={"model": "q", "prompt": "x"})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        err: dict[str, Any] = r.json()["error"]
        assert err["code"] == "rate_limit_exceeded" and "in flight" in err["message"]
        assert [x.status_code for x in reqs.join()] == [200]
        assert _metric(gw, 'fleet_rejected_total{reason="max_in_flight"}') == 1
        assert _metric(gw, 'fleet_requests_total{backend="none",code="429",model="q"}') == 1
        # The slot is given back: the next request passes.
        ok = httpx.post(gw.url + "/v1/completions", json={"model": "q", "prompt": "x", "max_tokens": 1})
        assert ok.status_code == 200
    finally:
        gw.stop()
        fake.stop()
