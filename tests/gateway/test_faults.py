"""Issue 18's gateway findings, each against real processes: a lone replica that dies answers 503
with Retry-After and leaks no address; /ready means every served model can be served, with a
per-model form; vLLM's model-scoped endpoints outside /v1 (/tokenize, /detokenize) are routed,
and its admin routes are not."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx

from tests.support.procs import FakeVllm, Gateway, Proc, instances, wait_until


def test_lone_replica_killed_is_503_without_internal_details(tmp_path: Path, procs: list[Proc]) -> None:
    fake = FakeVllm(tmp_path, ["solo"])
    procs.append(fake)
    # Probes far apart: the requests below arrive before any probe sees the replica gone.
    gw = Gateway(tmp_path, instances(fake), env={"FLEET_HEALTH_INTERVAL_S": "60", "FLEET_HEALTH_FAILURES": "3"})
    procs.append(gw)
    fake.signal(signal.SIGKILL)
    fake.popen.wait()
    for stream in (False, True):
        r = httpx.post(gw.url + "/v1/chat/completions", timeout=30,
                       json={"model": "solo", "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 503, r.text
        assert int(r.headers["retry-after"]) >= 1
        err = r.json()["error"]
        assert err["code"] == "no_healthy_backend" and err["type"] == "service_unavailable"
        for leak in ("127.0.0.1", str(fake.port), "Error", "Refused", "ConnectFailed"):
            assert leak not in err["message"], (leak, err["message"])
    # What happened is in the gateway's log, for the operator.
    assert "ConnectFailed" in gw.log.read_text() or "Connection refused" in gw.log.read_text()


def test_ready_means_every_model_has_a_servable_replica(tmp_path: Path, procs: list[Proc]) -> None:
    a, b = FakeVllm(tmp_path, ["model-a"]), FakeVllm(tmp_path, ["model-b"])
    procs += [a, b]
    gw = Gateway(tmp_path, instances(a, b))
    procs.append(gw)
    r = httpx.get(gw.url + "/ready")
    assert r.status_code == 200 and r.json()["models"] == ["model-a", "model-b"]
    b.configure(health_status=503)
    assert wait_until(lambda: httpx.get(gw.url + "/ready").status_code == 503)
    r = httpx.get(gw.url + "/ready")
    assert "model-b" in r.json()["error"]["message"] and "model-a" not in r.json()["error"]["message"]
    assert int(r.headers["retry-after"]) >= 1
    assert httpx.get(gw.url + "/ready", params={"model": "model-a"}).status_code == 200
    assert httpx.get(gw.url + "/ready", params={"model": "model-b"}).status_code == 503
    missing = httpx.get(gw.url + "/ready", params={"model": "nope"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    b.configure(health_status=200)
    assert wait_until(lambda: httpx.get(gw.url + "/ready").status_code == 200)


def test_ready_waits_for_every_model_at_startup(tmp_path: Path, procs: list[Proc]) -> None:
    up = FakeVllm(tmp_path, ["early"])
    late = FakeVllm(tmp_path, ["late"], "--fake-never-healthy")
    procs += [up, late]
    gw = Gateway(tmp_path, instances(up, late), wait_ready=False)
    procs.append(gw)
    assert wait_until(lambda: httpx.get(gw.url + "/fleet").json()["backends"][0]["healthy"])
    # One model served, the other not yet: not ready, and a request for the second is a 503.
    assert httpx.get(gw.url + "/ready").status_code == 503
    late.configure(health_status=200)
    assert wait_until(lambda: httpx.get(gw.url + "/ready").status_code == 200)
    chat = {"model": "late", "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(gw.url + "/v1/chat/completions", json=chat).status_code == 200


def test_tokenize_and_detokenize_are_routed_admin_routes_are_not(tmp_path: Path, procs: list[Proc]) -> None:
    x, y = FakeVllm(tmp_path, ["x"]), FakeVllm(tmp_path, ["y"])
    procs += [x, y]
    gw = Gateway(tmp_path, instances(x, y))
    procs.append(gw)
    r = httpx.post(gw.url + "/tokenize", json={"model": "y", "prompt": "one two three"})
    assert r.status_code == 200, r.text
    assert r.json()["count"] == 3 and r.json()["served_by"] == f"fake-{y.port}"
    assert r.headers["x-fleet-backend"] == f"fake-{y.port}"
    d = httpx.post(gw.url + "/detokenize", json={"model": "x", "tokens": [1, 2]})
    assert d.status_code == 200 and d.json()["prompt"] == "w1 w2"
    assert httpx.post(gw.url + "/tokenize", json={"model": "nope", "prompt": "a"}).status_code == 404
    # vLLM's admin routes at the root are never reachable through the gateway.
    for path in ("/sleep", "/wake_up", "/collective_rpc", "/reset_prefix_cache", "/pause"):
        r = httpx.post(gw.url + path, json={"model": "x"})
        assert r.status_code in (404, 405), (path, r.status_code)
        assert "error" in r.json()
