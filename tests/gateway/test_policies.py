"""The failure-handling policies without sockets: retry pauses and deadline, ejection periods and
the last-replica rule, the limiter's FIFO hand-off, and the 500 envelope for a bug in the proxy."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from fleetspec.infernet import BackendSpec
from fleetspec.tiers import VramTier
from gateway.app import FleetGateway
from gateway.backend import Backend, BackendSet
from gateway.ejection import Ejector
from gateway.limiter import QUEUE_FULL, QUEUE_TIMEOUT, Limiter, Rejected
from gateway.metrics import GatewayMetrics
from gateway.pool import BackendPool
from gateway.retry import RetryPolicy
from gateway.settings import GatewaySettings
from gateway.state import BackendState as S


def _b(name: str, models: list[str]) -> Backend:
    b = Backend(name, f"http://{name}", VramTier.UNKNOWN, models, list(models))
    b.state = S.HEALTHY
    return b


def test_backoff_is_jittered_exponential_and_bounded() -> None:
    p = RetryPolicy(GatewaySettings(max_attempts=10, retry_backoff_base_s=0.05, retry_backoff_max_s=1.0,
                                    retry_deadline_s=100))
    for attempt, high in [(1, 0.05), (2, 0.1), (3, 0.2), (6, 1.0), (9, 1.0)]:
        pauses = [p.backoff(attempt, 0.0) for _ in range(200)]
        assert all(x is not None and 0 <= x <= high for x in pauses), (attempt, max(x or 0 for x in pauses))
        assert len(set(pauses)) > 150  # jittered, not a fixed step
    assert p.backoff(10, 0.0) is None  # attempts spent


def test_no_retry_starts_past_the_deadline() -> None:
    p = RetryPolicy(GatewaySettings(max_attempts=5, retry_backoff_base_s=0.05, retry_deadline_s=2.0))
    assert p.backoff(1, 1.0) is not None
    assert p.backoff(1, 2.0) is None
    assert RetryPolicy(GatewaySettings(retry_deadline_s=0)).backoff(1, 0.0) is None


def test_ejection_period_grows_and_spares_the_last_replica() -> None:
    a, b = _b("a", ["m"]), _b("b", ["m", "only-b"])
    pool = BackendPool(BackendSet([a, b]), None)
    ej = Ejector(pool.backends, GatewaySettings(eject_failures=2, eject_base_s=5, eject_max_s=12), GatewayMetrics())
    ej.failure(a, "x")
    assert a.state == S.HEALTHY
    ej.failure(a, "x")
    assert a.state == S.EJECTED and 4 < a.ejected_until - a.last_change <= 5
    for _ in range(5):  # b is the last replica of "m" now, and the only one of "only-b"
        ej.failure(b, "x")
    assert b.state == S.HEALTHY
    # Back through a probe once the period is over, then failing again soon: a longer period.
    a.ejected_until = 0
    assert a.record_probe(True, None, 3, 2) and a.state == S.HEALTHY and a.request_failures == 0
    ej.failure(a, "x")
    ej.failure(a, "x")
    assert a.state == S.EJECTED and 9 < a.ejected_until - a.last_change <= 10
    a.ejected_until = 0
    a.record_probe(True, None, 3, 2)
    ej.failure(a, "x")
    ej.failure(a, "x")
    assert 11 < a.ejected_until - a.last_change <= 12  # capped at eject_max_s
    # Bad probes take an ejected backend to unhealthy, as from any state; a good probe within the
    # period does not end the ejection.
    assert not a.record_probe(True, None, 3, 2) and a.state == S.EJECTED
    for _ in range(3):
        a.record_probe(False, "down", 3, 2)
    assert a.state == S.UNHEALTHY


async def test_limiter_hands_freed_slots_to_waiters_in_order() -> None:
    a = _b("a", ["m"])
    pool = BackendPool(BackendSet([a]), None)
    lim = Limiter(pool, GatewaySettings(backend_max_concurrency=1, backend_queue=2, queue_timeout_s=5),
                  GatewayMetrics())
    loop = asyncio.get_running_loop()
    first = await lim.acquire("m", (), loop.time() + 10)
    assert first is a and a.in_flight == 1
    order: list[int] = []

    async def wait(i: int) -> None:
        b = await lim.acquire("m", (), loop.time() + 10)
        assert b is a
        order.append(i)
        lim.release(a)

    tasks = [asyncio.create_task(wait(i)) for i in range(2)]
    await asyncio.sleep(0)
    assert lim.waiting == 2
    with pytest.raises(Rejected) as full:
        await lim.acquire("m", (), loop.time() + 10)
    assert full.value.reason == QUEUE_FULL
    lim.release(a)
    await asyncio.gather(*tasks)
    assert order == [0, 1] and a.in_flight == 0 and lim.waiting == 0


async def test_limiter_cancelled_or_timed_out_waiters_leave_the_queue() -> None:
    a = _b("a", ["m"])
    lim = Limiter(BackendPool(BackendSet([a]), None), GatewaySettings(backend_max_concurrency=1, queue_timeout_s=0.05),
                  GatewayMetrics())
    loop = asyncio.get_running_loop()
    await lim.acquire("m", (), loop.time() + 10)
    t = asyncio.create_task(lim.acquire("m", (), loop.time() + 10))
    await asyncio.sleep(0)
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    assert lim.waiting == 0
    with pytest.raises(Rejected) as late:
        await lim.acquire("m", (), loop.time() + 10)
    assert late.value.reason == QUEUE_TIMEOUT and lim.waiting == 0
    lim.release(a)
    assert a.in_flight == 0


async def test_unexpected_error_in_the_proxy_is_a_500_envelope(monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    gw = FleetGateway(GatewaySettings(), [BackendSpec("a", "http://127.0.0.1:9", ["m"])], None)
    gw.pool.backends[0].state = S.HEALTHY

    def boom(*_: Any) -> None:
        raise RuntimeError("secret internals")

    # Nothing listens on a's port; the refusal reaches the ejector, which raises. (Not a patched
    # method of the proxy: a build compiled with mypyc refuses that.)
    monkeypatch.setattr(gw.proxy.opener.ejector, "failure", boom)
    sent: list[dict[str, Any]] = []
    body = [{"type": "http.request", "body": b'{"model": "m"}', "more_body": False}]

    async def receive() -> dict[str, Any]:
        if body:
            return body.pop()
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [], "query_string": b""}
    await gw(scope, receive, send)
    assert sent[0]["status"] == 500
    err = json.loads(sent[1]["body"])["error"]
    assert err["code"] == "internal_error" and "secret" not in err["message"]
    assert "Traceback" not in sent[1]["body"].decode()
    assert "secret internals" in caplog.text  # the operator gets the trace in the log
    assert gw.limiter.in_flight == 0
