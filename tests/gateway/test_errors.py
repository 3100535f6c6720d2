"""Every error the gateway produces itself answers with the OpenAI envelope and the right status."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.procs import FakeVllm, Gateway, Proc, instances, wait_until


def _err(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return dict(body["error"])


def test_malformed_json_is_400(gateway: Gateway) -> None:
    r = httpx.post(gateway.url + "/v1/chat/completions", content=b"{not json")
    assert r.status_code == 400
    assert _err(r)["code"] == "invalid_json"


@pytest.mark.parametrize("body", [b"[]", b'"text"', b"{}", b'{"model": ""}', b'{"model": 3}'])
def test_missing_or_bad_model_is_400(gateway: Gateway, body: bytes) -> None:
    r = httpx.post(gateway.url + "/v1/chat/completions", content=body)
    assert r.status_code == 400
    e = _err(r)
    assert e["code"] in {"missing_model", "invalid_json"}


def test_body_over_limit_is_413(gateway: Gateway) -> None:
    big = b'{"model": "m1", "prompt": "' + b"x" * (17 * 1024 * 1024) + b'"}'
    r = httpx.post(gateway.url + "/v1/completions", content=big, timeout=30)
    assert r.status_code == 413
    assert _err(r)["code"] == "request_too_large"


def test_path_tricks_never_reach_a_backend(gateway: Gateway, fakes: list[FakeVllm]) -> None:
    # Sent over a raw socket: httpx would normalize the dot segments away before sending.
    body = b'{"model": "m1"}'
    before = [f.stats()["requests_total"] for f in fakes]
    for path in [b"/v1/../health", b"/v1//chat/completions", b"/v1/chat%2f..%2fx", b"/v1/./completions"]:
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as s:
            s.sendall(b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: "
                      + str(len(body)).encode() + b"\r\n\r\n" + body)
            head = s.makefile("rb").readline()
        assert int(head.split()[1]) in {404, 405}, (path, head)
    assert [f.stats()["requests_total"] for f in fakes] == before


def test_unknown_get_route_has_envelope(gateway: Gateway) -> None:
    r = httpx.get(gateway.url + "/nope")
    assert r.status_code == 404
    _err(r)


def test_no_healthy_backend_is_503_with_retry_after(tmp_path: Path, procs: list[Proc]) -> None:
    fake = FakeVllm(tmp_path, ["solo"])
    procs.append(fake)
    gw = Gateway(tmp_path, instances(fake))
    procs.append(gw)
    fake.configure(health_status=503)
    assert wait_until(lambda: httpx.get(gw.url + "/ready").status_code == 503)
    r = httpx.post(gw.url + "/v1/chat/completions", json={"model": "solo", "messages": []})
    assert r.status_code == 503
    assert int(r.headers["retry-after"]) >= 1
    assert _err(r)["code"] == "no_healthy_backend"
    ready = httpx.get(gw.url + "/ready")
    assert ready.status_code == 503 and _err(ready)["code"] == "no_healthy_backend"
    assert httpx.get(gw.url + "/health").status_code == 200
    # The model stays known while its only server is down: 503 (come back), not 404 (wrong name).
    assert httpx.get(gw.url + "/fleet").json()["backends"][0]["state"] == "unhealthy"


def test_api_keys(tmp_path: Path, procs: list[Proc]) -> None:
    fake = FakeVllm(tmp_path, ["m"])
    procs.append(fake)
    keyfile = tmp_path / "keys"
    keyfile.write_text("# ops keys\nfilekey\n")
    gw = Gateway(tmp_path, instances(fake), env={"FLEET_API_KEYS": "k1, k2", "FLEET_API_KEYS_FILE": str(keyfile),
                                                  "FLEET_PROTECT_METRICS": "true"})
    procs.append(gw)
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    for headers in [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "k1"}, {"Authorization": "Basic k1"}]:
        r = httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers)
        assert r.status_code == 401, headers
        assert _err(r)["code"] == "invalid_api_key"
    for key in ["k1", "k2", "filekey"]:
        ok = httpx.post(gw.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
        assert ok.status_code == 200, key
    # The client's key is the gateway's business; it is not forwarded to the backend.
    echoed = httpx.post(gw.url + "/v1/echo_headers", json={"model": "m"}, headers={"Authorization": "Bearer k1"})
    assert "authorization" not in echoed.json()
    # Infernet's daemon lists models with no key; health and readiness stay open too.
    assert httpx.get(gw.url + "/v1/models").status_code == 200
    assert httpx.get(gw.url + "/health").status_code == 200
    assert httpx.get(gw.url + "/metrics").status_code == 401
    assert httpx.get(gw.url + "/fleet", headers={"Authorization": "Bearer k2"}).status_code == 200


def test_request_id_is_propagated_or_generated(gateway: Gateway) -> None:
    r = httpx.post(gateway.url + "/v1/echo_headers", json={"model": "m2"}, headers={"X-Request-ID": "abc-123",
                                                                                   "Connection": "keep-alive"})
    assert r.headers["x-request-id"] == "abc-123"
    sent = r.json()
    assert sent["x-request-id"] == "abc-123"
    r2 = httpx.post(gateway.url + "/v1/echo_headers", json={"model": "m2"})
    assert len(r2.headers["x-request-id"]) == 32
    assert r2.json()["x-request-id"] == r2.headers["x-request-id"]
