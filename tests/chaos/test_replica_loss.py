"""SIGKILL one of two replicas under steady load, and count what the clients see.

Non-streaming: requests that reach the dead replica fail with a refused connect (before the probes
notice) or with the connection closed before any response byte (those in flight at the kill);
both prove that no response started, so the gateway retries them on the other replica. The
target, and the measured figure, is 0 failed requests.

Streaming: a stream whose replica dies after its headers went to the client cannot be retried, but
it continues on the other replica (docs/stream-failover.md): the target, and the measured figure,
is 0 streams ending with the error event; none truncated silently, none hung (each is bounded by
a client timeout). With migration turned off, each such stream ends with the OpenAI error event and
a dropped connection instead, and nothing else.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Callable

import httpx

from tests.chaos.conftest import Pair
from tests.chaos.load import CLIENT_TIMEOUT, ERROR_EVENT, OK, TRUNCATED, Tally, closed_loop
from tests.support.procs import wait_until

CLIENTS = 8
LOAD_S = 4.0
KILL_AT_S = 1.5


def _state(gw_url: str, fake_url: str) -> str:
    return next(str(b["state"]) for b in httpx.get(gw_url + "/fleet").json()["backends"] if b["url"] == fake_url)


async def _load_with_kill(pair: Pair, bodies: list[dict[str, object]], tally: Tally) -> None:
    a, _b, gw = pair
    loop = asyncio.get_running_loop()
    loop.call_later(KILL_AT_S, a.signal, signal.SIGKILL)
    await closed_loop(gw.url, CLIENTS, LOAD_S, bodies, limit_s=10.0, tally=tally)


def test_sigkill_one_replica_under_non_streaming_load(make_pair: Callable[..., Pair]) -> None:
    a, b, gw = pair = make_pair()
    for f in (a, b):
        f.configure(latency=0.05)  # ~4 requests in flight on each replica at any moment
    tally = Tally()
    asyncio.run(_load_with_kill(pair, [{"model": "m", "prompt": "x", "max_tokens": 8}], tally))
    print("\nsigkill/non-streaming", json.dumps(tally.summary()))
    assert not a.alive()
    assert tally.total >= 100, tally.summary()
    assert tally.failures() == {}, tally.summary()  # the target: no client sees the kill
    assert tally.backends[f"fake-{b.port}"] > tally.backends[f"fake-{a.port}"]
    assert wait_until(lambda: _state(gw.url, a.url) == "unhealthy", timeout=5)
    retries = [ln for ln in httpx.get(gw.url + "/metrics").text.splitlines()
               if ln.startswith('fleet_retries_total{model="m"}')]
    print("retries:", retries)
    assert retries and float(retries[0].split()[-1]) >= 1  # the kill was absorbed by retries


STREAMS: list[dict[str, object]] = [
    {"model": "m", "prompt": "x", "max_tokens": 20, "stream": True},
    {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 20, "stream": True},
]


def _migrations(gw_url: str) -> dict[str, float]:
    return {ln.split('outcome="')[1].split('"')[0]: float(ln.split()[-1])
            for ln in httpx.get(gw_url + "/metrics").text.splitlines()
            if ln.startswith("fleet_stream_migrations_total{")}


def test_sigkill_one_replica_under_streaming_load(make_pair: Callable[..., Pair]) -> None:
    a, b, gw = pair = make_pair()
    for f in (a, b):
        f.configure(token_delay=0.02)  # 20 tokens: a 0.4 s stream
    tally = Tally()
    asyncio.run(_load_with_kill(pair, STREAMS, tally))
    print("\nsigkill/streaming", json.dumps(tally.summary()), _migrations(gw.url))
    assert not a.alive()
    assert tally.total >= 40, tally.summary()
    # The target: no client sees the kill. The streams open on the killed replica continued.
    assert tally.failures() == {}, tally.summary()
    assert _migrations(gw.url).get("migrated", 0) >= 1


def test_sigkill_without_migration_ends_streams_with_the_error_event(make_pair: Callable[..., Pair]) -> None:
    a, b, _gw = pair = make_pair(env={"FLEET_MAX_MIGRATIONS": "0"})
    for f in (a, b):
        f.configure(token_delay=0.02)
    tally = Tally()
    asyncio.run(_load_with_kill(pair, STREAMS, tally))
    print("\nsigkill/streaming, migration off", json.dumps(tally.summary()))
    # Every stream completed or ended with the error event; none truncated silently, none hung.
    assert set(tally.outcomes) <= {OK, ERROR_EVENT}, tally.summary()
    assert tally.outcomes[TRUNCATED] == 0 and tally.outcomes[CLIENT_TIMEOUT] == 0
    # Only streams open on the killed replica at the kill can fail: at most one per client.
    assert tally.outcomes[ERROR_EVENT] <= CLIENTS, tally.summary()
