"""Routing policies through the real gateway process to fake vLLM processes: conversations and
sessions stick to a replica, load-aware follows what /metrics says, per-model policies, and what
/fleet and /metrics show."""

from __future__ import annotations

import collections
import concurrent.futures
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.procs import FakeVllm, Gateway, instances, wait_until


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[FakeVllm, FakeVllm]]:
    a = FakeVllm(tmp_path, ["m", "n"])
    try:
        b = FakeVllm(tmp_path, ["m", "n"])
        try:
            yield a, b
        finally:
            b.stop()
    finally:
        a.stop()


def _gateway(tmp_path: Path, pair: tuple[FakeVllm, FakeVllm], **env: str) -> Gateway:
    return Gateway(tmp_path, instances(*pair), {"FLEET_LOAD_SCRAPE_INTERVAL_S": "0.1", **env})


def _chat(gw: Gateway, messages: list[dict[str, str]], model: str = "m", **extra: Any) -> str:
    headers = extra.pop("headers", {})
    r = httpx.post(gw.url + "/v1/chat/completions", json={"model": model, "messages": messages, **extra},
                   headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    return r.headers["x-fake-backend"]


def _decisions(gw: Gateway) -> dict[tuple[str, str, str], float]:
    text = httpx.get(gw.url + "/metrics").text
    pat = r'fleet_routing_decisions_total\{model="([^"]+)",policy="([^"]+)",reason="([^"]+)"\} ([0-9.e+]+)'
    return {(m, p, r): float(v) for m, p, r, v in re.findall(pat, text)}


def test_prefix_aware_keeps_conversations_and_sessions_together(tmp_path: Path,
                                                                pair: tuple[FakeVllm, FakeVllm]) -> None:
    gw = _gateway(tmp_path, pair, FLEET_ROUTING_POLICY="prefix_aware")
    try:
        homes: dict[int, set[str]] = collections.defaultdict(set)
        convs = [[{"role": "system", "content": f"You are assistant number {i}. " * 30}] for i in range(8)]
        for turn in range(4):
            for i, msgs in enumerate(convs):
                msgs.append({"role": "user", "content": f"question {turn} of conversation {i}"})
                homes[i].add(_chat(gw, msgs))
                msgs.append({"role": "assistant", "content": f"answer {turn}"})
        assert all(len(h) == 1 for h in homes.values()), homes  # every conversation stayed on one replica
        assert len({next(iter(h)) for h in homes.values()}) == 2  # and conversations used both replicas
        sessions = {s: {_chat(gw, [{"role": "user", "content": f"hi {k}"}], headers={"X-Session-Id": s})
                        for k in range(4)} for s in ("alice", "bob", "carol", "dave")}
        assert all(len(v) == 1 for v in sessions.values()), sessions
        by_user = {_chat(gw, [{"role": "user", "content": f"q{k}"}], user="erin") for k in range(4)}
        assert len(by_user) == 1
        d = _decisions(gw)
        assert d[("m", "prefix_aware", "prefix_match")] >= 8 * 3
        assert d[("m", "prefix_aware", "session")] >= 20
        fleet = httpx.get(gw.url + "/fleet").json()
        assert fleet["routing"]["m"]["policy"] == "prefix_aware"
        assert fleet["routing"]["m"]["prefix_index_blocks"] > 0
        assert wait_until(lambda: all(b["load"] is not None for b in httpx.get(gw.url + "/fleet").json()["backends"]))
    finally:
        gw.stop()


def test_load_aware_avoids_the_replica_vllm_says_is_busy(tmp_path: Path, pair: tuple[FakeVllm, FakeVllm]) -> None:
    a, b = pair
    gw = _gateway(tmp_path, pair, FLEET_ROUTING_POLICY="load_aware", FLEET_ROUTING_POLICIES='{"n": "round_robin"}')
    try:
        a.configure(load_running=5, load_waiting=3)  # another client keeps a busy

        def scraped() -> bool:
            loads = {x["name"]: x["load"] for x in httpx.get(gw.url + "/fleet").json()["backends"]}
            return bool(loads[f"fake-{a.port}"]) and loads[f"fake-{a.port}"]["waiting"] == 3
        assert wait_until(scraped)
        msgs = [{"role": "user", "content": "hello"}]
        assert collections.Counter(_chat(gw, msgs) for _ in range(10)) == {f"fake-{b.port}": 10}
        # The other model keeps its own policy: blind to load.
        assert len(collections.Counter(_chat(gw, msgs, model="n") for _ in range(10))) == 2
        a.configure(load_running=0, load_waiting=0)
        b.configure(load_kv=0.95)  # now b's cache is nearly full

        def rescraped() -> bool:  # both changes seen: a idle again, b's cache nearly full
            loads = {x["name"]: x["load"] for x in httpx.get(gw.url + "/fleet").json()["backends"]}
            return loads[f"fake-{a.port}"]["waiting"] == 0 and loads[f"fake-{b.port}"]["kv_cache_usage"] == 0.95
        assert wait_until(rescraped)
        assert collections.Counter(_chat(gw, msgs) for _ in range(10)) == {f"fake-{a.port}": 10}
        d = _decisions(gw)
        assert d[("m", "load_aware", "balanced")] == 20 and d[("n", "round_robin", "balanced")] == 10
        routing = httpx.get(gw.url + "/fleet").json()["routing"]
        assert (routing["m"]["policy"], routing["n"]["policy"]) == ("load_aware", "round_robin")
    finally:
        gw.stop()


def test_load_aware_stops_believing_gauges_that_nothing_moves(tmp_path: Path,
                                                              pair: tuple[FakeVllm, FakeVllm]) -> None:
    """vLLM's stuck gauge (bench/gpu/results/cut-gauges-h200): requests cut off at once left
    running at 108 with the token counters flat until the next request. A replica that is busy
    moves its counters and is still avoided; one that only says so is routed to again."""
    a, b = pair
    gw = _gateway(tmp_path, pair, FLEET_ROUTING_POLICY="load_aware")

    def load_of_a() -> dict[str, Any]:
        return next(x["load"] or {} for x in httpx.get(gw.url + "/fleet").json()["backends"]
                    if x["name"] == f"fake-{a.port}")

    def stalled_metric() -> float | None:
        """fleet_backend_load_stalled for a, as the gateway's /metrics says it."""
        for family in text_string_to_metric_families(httpx.get(gw.url + "/metrics").text):
            for sample in family.samples:
                if sample.name == "fleet_backend_load_stalled" and sample.labels["backend"] == f"fake-{a.port}":
                    return sample.value
        return None
    try:
        msgs = [{"role": "user", "content": "hello"}]
        a.configure(load_running=108, load_tokens=5000, load_tokens_step=40)  # busy: its counters move
        assert wait_until(lambda: load_of_a().get("running") == 108)
        time.sleep(1.0)  # twice the stall window (5 scrapes of 0.1 s): moving counters never stall
        assert load_of_a()["stalled"] is False
        assert collections.Counter(_chat(gw, msgs) for _ in range(10)) == {f"fake-{b.port}": 10}
        assert stalled_metric() == 0.0
        a.configure(load_tokens_step=0)  # the same 108, nothing moving: vLLM's stuck gauge
        assert wait_until(lambda: load_of_a().get("stalled") is True)
        assert stalled_metric() == 1.0
        got = collections.Counter(_chat(gw, msgs) for _ in range(10))
        assert got[f"fake-{a.port}"] >= 4, got  # in-flight counts alone: both replicas again
        assert "no token has moved for" in gw.log.read_text()
        a.configure(load_tokens_step=40)  # moving again: believed, and avoided
        assert wait_until(lambda: load_of_a().get("stalled") is False)
        assert stalled_metric() == 0.0
        assert collections.Counter(_chat(gw, msgs) for _ in range(10)) == {f"fake-{b.port}": 10}
    finally:
        gw.stop()


def test_affinity_gives_way_under_load(tmp_path: Path, pair: tuple[FakeVllm, FakeVllm]) -> None:
    """One hot conversation prefix, many concurrent requests: bounded loads spread them."""
    for f in pair:
        f.configure(latency=0.3)
    gw = _gateway(tmp_path, pair, FLEET_ROUTING_POLICY="prefix_aware")
    try:
        msgs = [{"role": "system", "content": "The one hot system prompt. " * 40}, {"role": "user", "content": "q"}]
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            picks = collections.Counter(pool.map(lambda _: _chat(gw, msgs), range(12)))
        assert len(picks) == 2 and min(picks.values()) >= 3, picks
        # The first time the holder is over the bound the prefix goes to the other replica too;
        # from then on both hold it, and the less loaded holder takes each request.
        d = _decisions(gw)
        assert d.get(("m", "prefix_aware", "affinity_overloaded"), 0) >= 1, d
    finally:
        gw.stop()
