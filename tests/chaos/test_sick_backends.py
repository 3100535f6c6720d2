"""Backends that are alive but sick, under steady load, one healthy replica beside them:

- a replica whose engine hangs (``hang``: it accepts and reads every POST and never answers, while
  /health stays 200, as vLLM does when its engine stalls);
- a frozen replica (SIGSTOP: the kernel still accepts connections, the process answers nothing,
  probes included);
- a slow replica (``latency`` before response headers);
- a flapping replica (health and answers toggling between 200 and 503 every 0.3 s).

The gateway keeps answering with bounded latency. A request already sent to a replica that then
never answers is not retried (it may have done work): it gets the 504 envelope after
FLEET_HEADERS_TIMEOUT_S. Those 504s are counted and bounded: passive ejection (or the probes, for
the frozen one) takes the sick replica out after a few.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Callable
from typing import Any

import httpx

from tests.chaos.conftest import Pair
from tests.chaos.load import OK, Tally, closed_loop, configure
from tests.support.procs import wait_until

CLIENTS = 8
BODY: list[dict[str, Any]] = [{"model": "m", "prompt": "x", "max_tokens": 8}]
HEADERS_TIMEOUT_S = 0.5
ENV = {"FLEET_HEADERS_TIMEOUT_S": str(HEADERS_TIMEOUT_S), "FLEET_EJECT_FAILURES": "3", "FLEET_EJECT_BASE_S": "1"}
TIMEOUT_504 = "http_504:upstream_timeout:gw"
# 10 ms per answer on the healthy replica keeps the load at a few hundred requests/s (2-core host).
HEALTHY = ("--fake-latency", "0.01")


def _metric(gw_url: str, prefix: str) -> float:
    return sum(float(ln.split()[-1]) for ln in httpx.get(gw_url + "/metrics").text.splitlines()
               if ln.startswith(prefix))


def _check_504_envelope(gw_url: str) -> None:
    """With only the hung replica in rotation, one request: the 504 envelope, on time."""
    r = httpx.post(gw_url + "/v1/completions", json=BODY[0], timeout=5)
    assert r.status_code == 504, r.text
    assert r.json() == {"error": {"message": r.json()["error"]["message"], "type": "upstream_error",
                                  "param": None, "code": "upstream_timeout"}}
    assert r.elapsed.total_seconds() < HEADERS_TIMEOUT_S + 1.0


def test_hung_replica(make_pair: Callable[..., Pair]) -> None:
    a, b, gw = make_pair(env=ENV, flags=HEALTHY)
    a.configure(hang=True)
    tally = Tally()
    asyncio.run(closed_loop(gw.url, CLIENTS, 4.0, BODY, limit_s=5.0, tally=tally))
    print("\nhung replica", json.dumps(tally.summary()))
    assert set(tally.outcomes) <= {OK, TIMEOUT_504}, tally.summary()
    assert tally.outcomes[OK] >= 100
    # Every answer within the headers timeout plus slack; no client waits on the hung replica longer.
    assert tally.pct(1.0) < HEADERS_TIMEOUT_S + 1.0, tally.summary()
    # 504s come in small bursts: at most the clients' requests open on it when it is (re)admitted
    # after each 1 s ejection (about 4 s / (1 s + 0.5 s) rounds).
    assert tally.outcomes[TIMEOUT_504] <= 4 * CLIENTS, tally.summary()
    assert _metric(gw.url, "fleet_backend_ejections_total") >= 1
    b.stop()  # only the hung replica is left (the probes take b out): the 504 envelope itself
    assert wait_until(lambda: not any(x["healthy"] and x["url"] == b.url
                                      for x in httpx.get(gw.url + "/fleet").json()["backends"]), timeout=5)
    assert wait_until(lambda: any(x["state"] == "healthy" for x in httpx.get(gw.url + "/fleet").json()["backends"]),
                      timeout=5)
    _check_504_envelope(gw.url)


def test_frozen_replica_accepts_and_never_answers(make_pair: Callable[..., Pair]) -> None:
    a, _b, gw = make_pair(env=ENV, flags=HEALTHY)

    async def run(tally: Tally) -> None:
        asyncio.get_running_loop().call_later(1.0, a.signal, signal.SIGSTOP)
        await closed_loop(gw.url, CLIENTS, 4.0, BODY, limit_s=5.0, tally=tally)

    tally = Tally()
    asyncio.run(run(tally))
    print("\nfrozen replica (SIGSTOP)", json.dumps(tally.summary()))
    a.signal(signal.SIGCONT)
    assert set(tally.outcomes) <= {OK, TIMEOUT_504}, tally.summary()
    assert tally.outcomes[OK] >= 100
    assert tally.pct(1.0) < HEADERS_TIMEOUT_S + 1.0, tally.summary()
    assert tally.outcomes[TIMEOUT_504] <= 2 * CLIENTS, tally.summary()


def test_slow_replica(make_pair: Callable[..., Pair]) -> None:
    a, b, gw = make_pair(env=ENV, flags=HEALTHY)
    a.configure(latency=0.4)
    tally = Tally()
    asyncio.run(closed_loop(gw.url, CLIENTS, 3.0, BODY, limit_s=5.0, tally=tally))
    print("\nslow replica", json.dumps(tally.summary()))
    assert tally.failures() == {}, tally.summary()
    assert tally.pct(1.0) < 0.4 + 0.6, tally.summary()
    # Fewest-in-flight sends most of the traffic to the fast replica.
    assert tally.backends[f"fake-{b.port}"] > 5 * tally.backends[f"fake-{a.port}"], tally.summary()


def test_flapping_replica(make_pair: Callable[..., Pair]) -> None:
    a, _b, gw = make_pair(env=ENV, flags=HEALTHY)

    async def run(tally: Tally) -> int:
        flaps = 0

        async def flap() -> None:
            nonlocal flaps
            up = True
            while True:
                await asyncio.sleep(0.3)
                up = not up
                status = 200 if up else 503
                await configure(a.url, health_status=status, status=status)
                flaps += 1

        flapper = asyncio.create_task(flap())
        try:
            await closed_loop(gw.url, CLIENTS, 4.0, BODY, limit_s=5.0, tally=tally)
        finally:
            flapper.cancel()
        return flaps

    tally = Tally()
    flaps = asyncio.run(run(tally))
    print("\nflapping replica", flaps, "flips", json.dumps(tally.summary()))
    assert flaps >= 10
    # A 503 from vLLM proves no work was done: retried on the healthy replica, never seen by a client.
    assert tally.failures() == {}, tally.summary()
    assert tally.pct(1.0) < 1.0, tally.summary()
