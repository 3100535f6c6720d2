"""Where the supervisor knows first: a backend moved to DRAINING hands its in-flight streams to another
replica before it goes (docs/stream-failover.md). The gateway runs in-process and is driven as raw
ASGI; the backend set is moved by the test exactly as the supervisor's feed (control.py) moves it,
and the replicas are fake vLLM processes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fleetspec.infernet import BackendSpec
from gateway.app import FleetGateway
from gateway.backend import Backend
from gateway.settings import GatewaySettings
from gateway.state import BackendState as S
from gateway.state import Writer
from tests.support.procs import FakeVllm

BODY = {"model": "m1", "stream": True, "max_tokens": 12, "messages": [{"role": "user", "content": "hi"}]}


class Client:
    """One raw ASGI request: what it was sent, and when it has had ``n`` body messages."""

    def __init__(self, gw: FleetGateway, body: dict[str, Any]) -> None:
        self.sent: list[dict[str, Any]] = []
        self._more = asyncio.Event()
        self._body = json.dumps(body).encode()
        self._asked = False
        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "query_string": b"",
                 "headers": [(b"content-type", b"application/json")], "http_version": "1.1"}
        self.task = asyncio.create_task(gw(scope, self._receive, self._send))

    async def _receive(self) -> dict[str, Any]:
        if not self._asked:
            self._asked = True
            return {"type": "http.request", "body": self._body, "more_body": False}
        await asyncio.Event().wait()  # the client never leaves
        raise AssertionError

    async def _send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        self._more.set()

    async def bodies(self, n: int) -> None:
        async with asyncio.timeout(10):
            while sum(m["type"] == "http.response.body" for m in self.sent) < n:
                self._more.clear()
                await self._more.wait()

    def backend(self, gw: FleetGateway) -> Backend:
        name = dict(self.sent[0]["headers"])[b"x-fleet-backend"].decode()
        b = gw.backends.get(name)
        assert b is not None
        return b

    def chunks(self) -> list[dict[str, Any]]:
        raw = b"".join(m.get("body", b"") for m in self.sent[1:]).decode()
        return [json.loads(e[6:]) for e in raw.split("\n\n") if e.startswith("data: {")]

    def ended_cleanly(self) -> bool:
        return self.sent[-1] == {"type": "http.response.body", "body": self.sent[-1]["body"], "more_body": False} \
            and b"data: [DONE]" in b"".join(m.get("body", b"") for m in self.sent)


def _gateway(*fakes: FakeVllm) -> FleetGateway:
    gw = FleetGateway(GatewaySettings(), [BackendSpec(f"fake-{f.port}", f.url, list(f.models)) for f in fakes], None)
    for b in gw.backends:
        b.move(Writer.PROBE, S.HEALTHY)  # no probes run in-process: what a first good probe does
    return gw


def _text(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def _answer(n: int) -> str:
    return "".join(f"t{i} " for i in range(n))


def _count(gw: FleetGateway, metric: str, **labels: str) -> float:
    value = gw.metrics.registry.get_sample_value(metric, labels)
    return value or 0.0


async def test_a_draining_backend_hands_its_streams_to_another_replica(fakes: list[FakeVllm]) -> None:
    for f in fakes[:2]:
        f.configure(token_delay=0.05)
    gw = _gateway(*fakes[:2])
    try:
        client = Client(gw, BODY)
        await client.bodies(3)  # the role chunk and two tokens
        draining = client.backend(gw)
        draining.move(Writer.SUPERVISOR, S.DRAINING)  # as control.py does when the supervisor drains it
        await asyncio.wait_for(client.task, 10)
        chunks = client.chunks()
        assert client.ended_cleanly() and _text(chunks) == _answer(12)
        made_by = {c["system_fingerprint"] for c in chunks}
        assert made_by == {f"fake-{f.port}" for f in fakes[:2]}  # it moved, and nothing was lost
        assert len({c["id"] for c in chunks}) == 1
        assert _count(gw, "fleet_stream_migrations_total", model="m1", outcome="migrated") == 1
        # Drained on purpose: not the backend's failure.
        assert draining.request_failures == 0
        assert _count(gw, "fleet_upstream_failures_total", backend=draining.name, phase="stream") == 0
        assert draining.in_flight == 0 and all(b.in_flight == 0 for b in gw.backends)
    finally:
        await gw.proxy.stop()


async def test_a_draining_lone_replica_finishes_its_streams(fakes: list[FakeVllm]) -> None:
    fakes[2].configure(token_delay=0.05)
    gw = _gateway(fakes[2])
    try:
        client = Client(gw, {**BODY, "model": "m2"})
        await client.bodies(3)
        client.backend(gw).move(Writer.SUPERVISOR, S.DRAINING)
        await asyncio.wait_for(client.task, 10)
        chunks = client.chunks()
        assert client.ended_cleanly() and _text(chunks) == _answer(12)
        assert {c["system_fingerprint"] for c in chunks} == {f"fake-{fakes[2].port}"}
        assert _count(gw, "fleet_stream_migrations_total", model="m2", outcome="migrated") == 0
    finally:
        await gw.proxy.stop()


async def test_a_stream_whose_head_comes_after_the_drain_began_moves_too(fakes: list[FakeVllm]) -> None:
    for f in fakes[:2]:
        f.configure(latency=0.5, token_delay=0.05)  # the drain begins before the response head
    gw = _gateway(*fakes[:2])
    try:
        client = Client(gw, BODY)
        async with asyncio.timeout(5):
            while not any(b.in_flight for b in gw.backends):  # noqa: ASYNC110 - a field, no event to wait on
                await asyncio.sleep(0.01)
        first = next(b for b in gw.backends if b.in_flight)
        first.move(Writer.SUPERVISOR, S.DRAINING)
        await asyncio.wait_for(client.task, 10)
        chunks = client.chunks()
        assert client.ended_cleanly() and _text(chunks) == _answer(12)
        assert {c["system_fingerprint"] for c in chunks if c["choices"][0]["delta"].get("content")} \
            == {next(f"fake-{f.port}" for f in fakes[:2] if f"fake-{f.port}" != first.name)}
        assert _count(gw, "fleet_stream_migrations_total", model="m1", outcome="migrated") == 1
    finally:
        await gw.proxy.stop()
