"""Streaming through the gateway: chunk by chunk, failures that look like failures, and client
disconnects that stop the upstream generation in every phase."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.procs import FakeVllm, Gateway, instances, wait_until


def _events(lines: list[str]) -> list[str]:
    return [ln[len("data: "):] for ln in lines if ln.startswith("data: ")]


def test_mid_stream_failure_ends_with_error_event_and_no_done(gateway: Gateway, fakes: list[FakeVllm]) -> None:
    """m2 has one replica: nowhere to continue (tests/gateway/test_migration.py has the rest)."""
    fakes[2].configure(drop_after=2)
    lines: list[str] = []
    with pytest.raises(httpx.RemoteProtocolError), httpx.stream(
        "POST", gateway.url + "/v1/chat/completions", timeout=10,
        json={"model": "m2", "stream": True, "max_tokens": 6, "messages": []},
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            lines.append(line)
    events = _events(lines)
    assert len(events) == 4, events  # the role chunk, t0, t1, the error event
    error = json.loads(events[-1])["error"]
    assert error["type"] == "upstream_error" and error["code"] == 502
    assert "no other replica" in error["message"]
    assert "[DONE]" not in events


def test_mid_stream_failure_is_an_error_for_the_sdk(gateway: Gateway, fakes: list[FakeVllm]) -> None:
    fakes[2].configure(drop_after=2)
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0)
    got: list[str | None] = []
    with pytest.raises(openai.APIError):
        for chunk in client.chat.completions.create(model="m2", messages=[], max_tokens=6, stream=True):
            got.append(chunk.choices[0].delta.content)
    assert got == ["", "t0 ", "t1 "]


def _raw_request(port: int, body: dict[str, object]) -> socket.socket:
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    return s


def test_disconnect_mid_stream_cancels_upstream(gateway: Gateway, fakes: list[FakeVllm]) -> None:
    fake = fakes[2]
    before = fake.stats()["cancelled"]
    fake.configure(token_delay=0.1, tokens=200)
    s = _raw_request(gateway.port, {"model": "m2", "stream": True, "messages": []})
    seen = b""
    while b"data: " not in seen:
        chunk = s.recv(65536)
        assert chunk, seen
        seen += chunk
    assert fake.stats()["in_flight"] == 1
    s.close()
    assert wait_until(lambda: fake.stats()["in_flight"] == 0, timeout=5)
    assert fake.stats()["cancelled"] == before + 1


def test_disconnect_before_headers_cancels_upstream(gateway: Gateway, fakes: list[FakeVllm]) -> None:
    fake = fakes[2]
    before = fake.stats()["cancelled"]
    fake.configure(latency=30)  # a long queue/prefill: no response headers yet
    s = _raw_request(gateway.port, {"model": "m2", "messages": []})
    assert wait_until(lambda: fake.stats()["in_flight"] == 1, timeout=5)
    s.close()
    assert wait_until(lambda: fake.stats()["in_flight"] == 0, timeout=5)
    assert fake.stats()["cancelled"] == before + 1
    metrics = httpx.get(gateway.url + "/metrics").text
    assert 'fleet_requests_total{backend="fake-' in metrics and 'code="499"' in metrics


def _codes(gateway: Gateway, model: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(gateway.url + "/metrics").text):
        for s in family.samples:
            if s.name == "fleet_requests_total" and s.labels["model"] == model:
                out[s.labels["code"]] = out.get(s.labels["code"], 0) + s.value
    return out


@pytest.mark.parametrize("migratable", [True, False])
def test_a_client_that_closes_right_after_done_got_a_whole_answer(
        gateway: Gateway, fakes: list[FakeVllm], migratable: bool) -> None:
    """The openai SDK closes a stream as soon as it reads ``[DONE]``, which can be before vLLM's
    chunked terminator arrives (a separate write): that is a complete answer (200, the upstream
    left to finish), not a client that gave up (499, the upstream connection cancelled)."""
    fake = fakes[2]
    fake.configure(eof_delay=0.5)
    before, cancelled = _codes(gateway, "m2"), fake.stats()["cancelled"]
    body: dict[str, object] = {"model": "m2", "stream": True, "max_tokens": 3,
                                "messages": [{"role": "user", "content": "hi"}]}
    if not migratable:
        body["n"] = 2  # relayed as it comes, not kept for a continuation (migration.py)
    s = _raw_request(gateway.port, body)
    seen = b""
    while b"data: [DONE]" not in seen:
        chunk = s.recv(65536)
        assert chunk, seen
        seen += chunk
    s.close()
    assert wait_until(lambda: sum(_codes(gateway, "m2").values()) == sum(before.values()) + 1, timeout=5)
    after = _codes(gateway, "m2")
    assert after.get("200", 0) == before.get("200", 0) + 1 and after.get("499", 0) == before.get("499", 0), after
    assert fake.stats()["cancelled"] == cancelled


def test_a_replica_that_dies_after_done_leaves_a_whole_answer(tmp_path: Path) -> None:
    """The replica dies between ``[DONE]`` and the end of its body, on a stream that cannot continue
    elsewhere (n > 1): the client has the whole answer, so its body ends cleanly (200), with no
    error event after ``[DONE]`` and no 502."""
    fake = FakeVllm(tmp_path, ["m9"], "--fake-eof-delay", "30")
    gw = Gateway(tmp_path, instances(fake))
    try:
        lines: list[str] = []
        with httpx.stream("POST", gw.url + "/v1/chat/completions", timeout=20,
                          json={"model": "m9", "stream": True, "max_tokens": 3, "n": 2, "messages": []}) as r:
            for line in r.iter_lines():
                lines.append(line)
                if line == "data: [DONE]":
                    os.kill(fake.pid, signal.SIGKILL)
        assert [ln for ln in lines if ln][-1] == "data: [DONE]", lines  # nothing after it, no error event
        codes = _codes(gw, "m9")
        assert codes == {"200": 1.0}, codes
    finally:
        gw.stop()
        fake.stop()


def test_ttfb_and_duration_are_measured(gateway: Gateway) -> None:
    httpx.post(gateway.url + "/v1/completions", json={"model": "m2", "prompt": "x", "max_tokens": 1})
    text = httpx.get(gateway.url + "/metrics").text
    counts = {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines()
              if ln.startswith(("fleet_time_to_first_byte_seconds_count", "fleet_request_duration_seconds_count"))}
    assert counts['fleet_time_to_first_byte_seconds_count{model="m2"}'] >= 1
    assert counts['fleet_request_duration_seconds_count{model="m2"}'] >= 1


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_slow_client_is_not_buffered_for(gateway: Gateway, fakes: list[FakeVllm]) -> None:
    """A client that stops reading pauses the upstream: the gateway's memory stays flat while the
    backend could send tens of MB, and leaving then still cancels the generation."""
    fake = fakes[2]
    before = fake.stats()["cancelled"]
    fake.configure(tokens=300_000)  # ~57 MB of SSE if nobody pushed back
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", gateway.port))
    body = json.dumps({"model": "m2", "stream": True, "messages": []}).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
              b"content-length: %d\r\n\r\n%s" % (len(body), body))
    assert s.recv(1024).startswith(b"HTTP/1.1 200")
    rss0 = _rss_kib(gateway.pid)
    time.sleep(3)  # not reading: without backpressure the gateway would take in the backend's output
    grown_mib = (_rss_kib(gateway.pid) - rss0) / 1024
    assert fake.stats()["in_flight"] == 1
    assert grown_mib < 8, f"gateway memory grew {grown_mib:.1f} MiB behind a stalled client"
    s.close()
    assert wait_until(lambda: fake.stats()["in_flight"] == 0, timeout=5)
    assert fake.stats()["cancelled"] == before + 1
