"""FLEET_UPSTREAM_WARM: connections to each backend opened before requests need them (gateway/warm.py),
counted on the backend's side from the kernel's table of TCP connections."""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
from pathlib import Path

import httpx

from fleetspec.infernet import BackendSpec
from gateway.app import FleetGateway
from gateway.settings import GatewaySettings
from gateway.upstream import UpstreamPool
from tests.support.procs import FakeVllm, Gateway, Proc, wait_until

LIMIT = 6  # the backend's --max-num-seqs, as `vllm-fleet up` writes it into the Infernet JSON


def established_to(port: int) -> int:
    """TCP connections in ESTABLISHED whose local end is ``port``: a server's accepted connections.
    A set: the kernel writes the table in pieces, and an entry can show twice while it changes."""
    seen: set[tuple[str, str]] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                seen.add((fields[1], fields[2]))
    return len(seen)


def _config(fake: FakeVllm) -> dict[str, object]:
    return {"backend": "vllm", "served_models": ["m"],
            "vllm_instances": [{"host": fake.url, "models": ["m"], "name": "a", "max_num_seqs": LIMIT}]}


def _start(tmp_path: Path, procs: list[Proc], warm: bool = True,
           args: tuple[str, ...] = ()) -> tuple[FakeVllm, Gateway]:
    """A fake vLLM and a gateway in front of it (warming its connections unless ``warm`` is off),
    both stopped by ``procs`` after the test."""
    fake = FakeVllm(tmp_path, ["m"])
    procs.append(fake)
    gw = Gateway(tmp_path, _config(fake), env={"FLEET_UPSTREAM_WARM": "true"} if warm else None, args=args)
    procs.append(gw)
    return fake, gw


def _pool(gw: Gateway) -> dict[str, int]:
    conns = httpx.get(gw.url + "/fleet", timeout=5).json()["backends"][0]["connections"]
    return {k: conns[k] for k in ("open", "idle")}


def _per_api_server(gw: Gateway) -> list[int]:
    return list(httpx.get(gw.url + "/fleet", timeout=5).json()["backends"][0]["connections"]["per_api_server"])


def _chat(gw: Gateway) -> int:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=10).status_code


def test_requests_find_their_connections_open(tmp_path: Path, procs: list[Proc]) -> None:
    fake, gw = _start(tmp_path, procs)
    # The limit's worth of connections idle in the gateway's pool, which the backend sees too
    # (plus at most the probes' own).
    assert wait_until(lambda: _pool(gw) == {"open": LIMIT, "idle": LIMIT}, timeout=10), _pool(gw)
    # One process accepts on the fake's port: all of the pool on it (accept_split.py read it)
    assert wait_until(lambda: _per_api_server(gw) == [LIMIT], timeout=10), _per_api_server(gw)
    before = established_to(fake.port)
    assert LIMIT <= before <= LIMIT + 2
    fake.configure(latency=0.5)
    peak = 0
    with concurrent.futures.ThreadPoolExecutor(LIMIT) as ex:
        futures = [ex.submit(_chat, gw) for _ in range(LIMIT)]
        while not all(f.done() for f in futures):
            peak = max(peak, established_to(fake.port))
        assert [f.result() for f in futures] == [200] * LIMIT
    assert fake.stats()["peak_in_flight"] == LIMIT  # all six were open upstream at once...
    assert peak <= before  # ...on connections that were open before they came


def _held(gw: Gateway) -> dict[str, float]:
    """``fleet_upstream_connections`` by state, from the gateway's /metrics."""
    text = httpx.get(gw.url + "/metrics", timeout=5).text
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r'^fleet_upstream_connections\{backend="a",state="(\w+)"\} (\S+)$', text, re.M)}


def test_metrics_show_the_connections_held(tmp_path: Path, procs: list[Proc]) -> None:
    fake, gw = _start(tmp_path, procs)
    assert wait_until(lambda: _held(gw) == {"open": LIMIT, "idle": LIMIT}, timeout=10), _held(gw)
    fake.configure(latency=2.0)
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        futures = [ex.submit(_chat, gw) for _ in range(2)]
        # two busy on their way: at a probe (every 0.2 s here) the gauge follows the pool
        assert wait_until(lambda: _held(gw) == {"open": LIMIT, "idle": LIMIT - 2}, timeout=1.8), _held(gw)
        assert [f.result() for f in futures] == [200, 200]
    assert wait_until(lambda: _held(gw) == {"open": LIMIT, "idle": LIMIT}, timeout=5), _held(gw)


def test_metrics_sum_the_workers_connections(tmp_path: Path, procs: list[Proc]) -> None:
    # Two workers each warm half the limit; a scrape of either shows what the backend holds from both.
    fake, gw = _start(tmp_path, procs, args=("--workers", "2"))
    assert wait_until(lambda: _held(gw) == {"open": LIMIT, "idle": LIMIT}, timeout=15), _held(gw)
    assert _pool(gw) == {"open": LIMIT // 2, "idle": LIMIT // 2}  # /fleet: the answering worker's own
    assert wait_until(lambda: established_to(fake.port) >= LIMIT, timeout=5), established_to(fake.port)


def test_connections_come_back_after_the_backend_restarts(tmp_path: Path, procs: list[Proc]) -> None:
    fake, gw = _start(tmp_path, procs)
    assert wait_until(lambda: _pool(gw)["idle"] == LIMIT, timeout=10), _pool(gw)
    fake.restart()  # every connection closes with the old process: those counted now are new ones
    assert wait_until(lambda: established_to(fake.port) >= LIMIT, timeout=10), established_to(fake.port)
    assert wait_until(lambda: _pool(gw) == {"open": LIMIT, "idle": LIMIT}, timeout=10), _pool(gw)
    assert _chat(gw) == 200


def test_off_by_default(tmp_path: Path, procs: list[Proc]) -> None:
    _, gw = _start(tmp_path, procs, warm=False)
    assert _chat(gw) == 200
    assert not wait_until(lambda: _pool(gw)["open"] > 1, timeout=1.5), _pool(gw)
    assert _pool(gw) == {"open": 1, "idle": 1}  # the one the request opened, kept for the next


def test_a_backend_that_closes_what_it_accepts_is_not_dialled_in_a_loop() -> None:
    async def scenario() -> tuple[int, int]:
        accepted = 0

        async def close_at_once(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal accepted
            accepted += 1
            writer.close()

        server = await asyncio.start_server(close_at_once, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = UpstreamPool(connect_timeout_s=2)
        try:
            up = await asyncio.wait_for(pool.warm(f"http://127.0.0.1:{port}", 40), 5)
            await asyncio.sleep(0.1)  # the closes reach the pool
            return up, accepted
        finally:
            pool.close()
            server.close()
            await server.wait_closed()

    up, accepted = asyncio.run(scenario())
    assert accepted == 40  # one try per connection asked for (3 batches), not a loop
    assert up <= 40


def test_each_worker_warms_its_share_once() -> None:
    # Four workers with no shared table (a backend beyond its 1,023 names): each limits itself to
    # 1/4 of the backend's 100 sequences, and warms that share, not a quarter of it again.
    settings = GatewaySettings(workers=4, upstream_warm=True)
    gw = FleetGateway(settings, [BackendSpec("a", "http://127.0.0.1:9", ["m"], max_num_seqs=100)], None)
    b = gw.backends.get("a")
    assert b is not None and gw.warmer is not None
    assert gw.limiter.limit(b) == 25
    assert gw.warmer.target(b) == 25
