"""Failure handling beyond a single request: caps on the request, the total timeout, passive
ejection of a failing replica (and never of the last one), and routing the client cannot steer."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import DEFAULT_KNOBS
from tests.support.procs import FakeVllm, Gateway, instances, wait_until

ENV = {"FLEET_EJECT_BASE_S": "0.5", "FLEET_EJECT_FAILURES": "3", "FLEET_TOTAL_TIMEOUT_S": "1.5",
       "FLEET_MAX_TOKENS_CAP": "100", "FLEET_MAX_N_CAP": "4"}


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeVllm, FakeVllm, FakeVllm, Gateway]]:
    """Two replicas of 'm' and one lone server of 'solo' behind a gateway with short limits."""
    tmp = tmp_path_factory.mktemp("resilience")
    started: list[FakeVllm] = []
    gw = None
    try:
        started += [FakeVllm(tmp, ["m"]), FakeVllm(tmp, ["m"]), FakeVllm(tmp, ["solo"])]
        gw = Gateway(tmp, instances(*started), env=ENV)
        yield started[0], started[1], started[2], gw
    finally:
        if gw is not None:
            gw.stop()
        for f in started:
            f.stop()


@pytest.fixture(autouse=True)
def _reset(trio: tuple[FakeVllm, FakeVllm, FakeVllm, Gateway]) -> Iterator[None]:
    yield
    *fakes, gw = trio
    for f in fakes:
        f.configure(**DEFAULT_KNOBS)
    assert wait_until(gw.all_healthy, timeout=10), "a backend did not return to rotation after the test"


def _err(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return dict(body["error"])


def _backend(gw: Gateway, name: str) -> dict[str, Any]:
    return next(dict(b) for b in httpx.get(gw.url + "/fleet").json()["backends"] if b["name"] == name)


@pytest.mark.parametrize(("field", "value"), [("max_tokens", 101), ("max_completion_tokens", 5000),
                                              ("n", 5), ("max_tokens", 1e9)])
def test_caps_answer_400_naming_the_field(trio: Any, field: str, value: float) -> None:
    *_, gw = trio
    r = httpx.post(gw.url + "/v1/chat/completions", json={"model": "m", "messages": [], field: value})
    assert r.status_code == 400
    e = _err(r)
    assert e["param"] == field and e["code"] == "value_above_limit" and e["type"] == "invalid_request_error"


def test_within_caps_the_body_is_forwarded_byte_for_byte(trio: Any) -> None:
    *_, gw = trio
    body = b'{ "n":4,"model" : "m",  "max_tokens": 100, "x": "\\u00e9\xc3\xa9", "max_completion_tokens":1 }'
    r = httpx.post(gw.url + "/v1/echo_body", content=body)
    assert r.status_code == 200 and r.content == body


def test_total_timeout_before_headers_is_504(trio: Any) -> None:
    *_, solo, gw = trio
    solo.configure(latency=10)
    failures = _backend(gw, f"fake-{solo.port}")["request_failures"]
    t = time.monotonic()
    r = httpx.post(gw.url + "/v1/completions", json={"model": "solo", "prompt": "x"}, timeout=10)
    assert r.status_code == 504 and _err(r)["code"] == "request_timeout"
    assert time.monotonic() - t < 5
    assert wait_until(lambda: solo.stats()["in_flight"] == 0, timeout=5)  # upstream request closed
    # The gateway's own budget is not the backend's fault: no ejection count.
    assert _backend(gw, f"fake-{solo.port}")["request_failures"] == failures


def test_total_timeout_mid_stream_ends_with_error_event_and_no_done(trio: Any) -> None:
    *_, solo, gw = trio
    solo.configure(token_delay=0.1)
    lines: list[str] = []
    with pytest.raises(httpx.RemoteProtocolError), httpx.stream(
        "POST", gw.url + "/v1/completions", timeout=10,
        json={"model": "solo", "prompt": "x", "stream": True, "max_tokens": 100},
    ) as r:
        assert r.status_code == 200
        lines.extend(r.iter_lines())
    events = [ln[6:] for ln in lines if ln.startswith("data: ")]
    assert 3 <= len(events) < 100, events
    assert json.loads(events[-1])["error"]["code"] == 504
    assert "[DONE]" not in events
    assert wait_until(lambda: solo.stats()["in_flight"] == 0, timeout=5)


def test_failing_replica_is_ejected_then_returns_through_a_probe(trio: Any) -> None:
    a, b, _, gw = trio
    name = f"fake-{a.port}"
    a.configure(status=503)
    # Every request succeeds: a 503 is retried on the other replica before any byte.
    for _ in range(8):
        r = httpx.post(gw.url + "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1})
        assert r.status_code == 200 and r.headers["x-fake-backend"] == f"fake-{b.port}", r.text
        if _backend(gw, name)["state"] == "ejected":
            break
    info = _backend(gw, name)
    assert info["state"] == "ejected" and not info["healthy"]
    assert info["ejected_until"] > time.time() - 1
    metrics = httpx.get(gw.url + "/metrics").text
    assert f'fleet_backend_ejections_total{{backend="{name}"}} 1.0' in metrics
    assert f'fleet_backend_healthy{{backend="{name}"}} 0.0' in metrics
    # While ejected nothing is sent to it, not even first tries.
    before = a.stats()["requests_total"]
    for _ in range(4):
        httpx.post(gw.url + "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1})
    if _backend(gw, name)["state"] == "ejected":
        assert a.stats()["requests_total"] == before
    a.configure(status=200)
    assert wait_until(lambda: _backend(gw, name)["state"] == "healthy", timeout=5)
    assert f'fleet_backend_healthy{{backend="{name}"}} 1.0' in httpx.get(gw.url + "/metrics").text


def test_last_replica_is_never_ejected_passively(trio: Any) -> None:
    *_, solo, gw = trio
    solo.configure(status=503)
    for _ in range(6):
        r = httpx.post(gw.url + "/v1/completions", json={"model": "solo", "prompt": "x"})
        assert r.status_code == 503  # the upstream's answer passes through: nobody else to ask
    info = _backend(gw, f"fake-{solo.port}")
    assert info["state"] == "healthy" and info["request_failures"] >= 6


def test_the_client_cannot_choose_the_upstream(trio: Any) -> None:
    a, b, solo, gw = trio
    other = f"127.0.0.1:{a.port}"
    body = {"model": "solo", "prompt": "x", "max_tokens": 1, "api_base": f"http://{other}/v1",
            "base_url": f"http://{other}/v1", "host": other, "url": f"http://{other}", "backend": f"fake-{a.port}"}
    before = (a.stats()["requests_total"], b.stats()["requests_total"])
    for _ in range(3):
        r = httpx.post(gw.url + "/v1/completions", json=body,
                       headers={"Host": other, "X-Forwarded-Host": other, "X-Forwarded-For": "127.0.0.1",
                                "Forwarded": f"host={other}", "X-Fleet-Backend": f"fake-{a.port}"})
        assert r.status_code == 200 and r.headers["x-fake-backend"] == f"fake-{solo.port}"
    # An absolute-form request target naming another server changes nothing either.
    data = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as s:
        s.sendall(f"POST http://{other}/v1/completions HTTP/1.1\r\nHost: {other}\r\nConnection: close\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200") and f"x-fake-backend: fake-{solo.port}".encode() in reply.lower()
    assert (a.stats()["requests_total"], b.stats()["requests_total"]) == before
