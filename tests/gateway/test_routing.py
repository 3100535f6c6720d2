"""Routing policies without sockets: the /metrics parser, load scores, prefix blocks and index,
the bounded-load ring, and each policy's choices and reasons through BackendPool.pick."""

from __future__ import annotations

import collections
import time
from typing import Any

import pytest

from fleetspec.policies import Policy
from fleetspec.tiers import VramTier
from gateway.backend import Backend, BackendSet
from gateway.load import UpstreamLoad, load_estimate, load_score, parse_load, settle
from gateway.pool import BackendPool
from gateway.prefix import BLOCK_CHARS, HashRing, PrefixIndex, block_hashes, prompt_text
from gateway.routing import OVERLOADED, PREFIX_MATCH, PREFIX_MISS, SESSION, Router, hint_for
from gateway.state import BackendState as S

# Shaped like vLLM 0.32's exposition: HELP/TYPE lines, label sets, a histogram, _created series.
EXPOSITION = b"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
vllm:num_requests_running{engine="1",model_name="tiny"} 1.0
vllm:num_requests_waiting{engine="0",model_name="tiny"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="tiny"} 0.5
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 1000.0
vllm:prefix_cache_queries_created{engine="0",model_name="tiny"} 1.7e9
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 640.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="tiny"} 5.0
"""


def test_parse_load_sums_engines_and_takes_the_fullest_cache() -> None:
    u = parse_load(EXPOSITION, at=5.0, gateway_in_flight=2)
    assert (u.running, u.waiting, u.kv_usage) == (4.0, 2.0, 0.5)
    assert (u.prefix_hits, u.prefix_queries) == (640.0, 1000.0)
    assert (u.at, u.gateway_in_flight) == (5.0, 2)


def test_parse_load_accepts_older_vllm_names_and_ignores_junk() -> None:
    u = parse_load(b"vllm:gpu_cache_usage_perc{model_name=\"x\"} 0.75\nvllm:num_requests_waiting NaN\n"
                   b"vllm:num_requests_running{a=\"b\"} notanumber\nother_metric 9\n")
    assert u == UpstreamLoad(kv_usage=0.75)


def _b(name: str, in_flight: int = 0, load: UpstreamLoad | None = None) -> Backend:
    b = Backend(name, f"http://{name}", VramTier.UNKNOWN, ["m"], ["m"])
    b.state = S.HEALTHY
    b.in_flight = in_flight
    b.load = load
    return b


def test_load_estimate_adds_what_others_send_and_drops_stale_scrapes() -> None:
    now = time.monotonic()
    # At scrape time the gateway had 2 open and vLLM ran 5 and queued 1: 4 came from elsewhere.
    b = _b("a", in_flight=3, load=UpstreamLoad(running=5, waiting=1, kv_usage=0.5, at=now, gateway_in_flight=2))
    assert load_estimate(b, 3, now, 3.0) == 3 + 4
    assert load_score(b, 3, now, 3.0) == 3 + 4 + 1 + 4.0 * 0.5
    assert load_estimate(b, 3, now + 10, 3.0) == load_score(b, 3, now + 10, 3.0) == 3  # stale: own count only


def test_parse_load_sums_the_token_counters() -> None:
    text = (b'vllm:prompt_tokens_total{engine="0",model_name="tiny"} 100.0\n'
            b'vllm:prompt_tokens_created{engine="0",model_name="tiny"} 1.7e9\n'
            b'vllm:generation_tokens_total{engine="0",model_name="tiny"} 250.0\n')
    assert parse_load(text).tokens == 350.0
    assert parse_load(EXPOSITION).tokens is None  # no counter: settle never calls it stalled


def _scrape(at: float, running: float, tokens: float | None) -> UpstreamLoad:
    return UpstreamLoad(running=running, tokens=tokens, at=at)


def test_a_busy_scrape_whose_counters_stay_flat_stalls_and_is_not_believed() -> None:
    last = None
    stalled = []
    # vLLM's stuck gauge as measured: 108 running from t=0, the counters flat from then on.
    for t in range(8):
        last = settle(last, _scrape(float(t), 108, 5000.0), stall_after=5.0)
        stalled.append(last.stalled)
    assert stalled == [False] * 5 + [True] * 3  # from 5 s of no progress on
    b = _b("a", in_flight=1, load=last)
    assert load_estimate(b, 1, 7.0, 3.0) == load_score(b, 1, 7.0, 3.0) == 1  # the gateway's own only
    # The next request moves the counters (and, in vLLM, clears the gauge): believed again.
    moved = settle(last, _scrape(8.0, 1, 5004.0), stall_after=5.0)
    assert not moved.stalled and moved.flat_since == 8.0


def test_settle_starts_counting_when_a_replica_turns_busy_and_spares_counterless_ones() -> None:
    idle = settle(None, _scrape(0.0, 0, 100.0), 5.0)
    # Idle for an hour, counters flat all along: a request starting now is not a stall.
    busy = settle(settle(idle, _scrape(3600.0, 0, 100.0), 5.0), _scrape(3601.0, 3, 100.0), 5.0)
    assert (busy.stalled, busy.flat_since) == (False, 3601.0)
    # Busy and moving: never stalled, however long.
    last = busy
    for t in range(3602, 3620):
        last = settle(last, _scrape(float(t), 3, 100.0 + t), 5.0)
        assert not last.stalled
    # No counters exposed (another server, an old vLLM): the gauges are taken as they are.
    last = None
    for t in range(20):
        last = settle(last, _scrape(float(t), 9, None), 5.0)
    assert last is not None and not last.stalled


def _pool(policy: Policy, *backends: Backend, factor: float = 1.25) -> tuple[BackendPool, list[tuple[str, ...]]]:
    decisions: list[tuple[str, ...]] = []
    pool = BackendPool(BackendSet(backends), None, lambda _: Router(policy, factor, 1000, 3.0),
                       lambda *d: decisions.append(d))
    return pool, decisions


def _chat(*turns: str, system: str = "S" * 600) -> dict[str, Any]:
    msgs = [{"role": "system", "content": system}]
    msgs += [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    return {"model": "m", "messages": msgs}


def test_round_robin_ignores_load() -> None:
    a, b = _b("a", in_flight=50), _b("b")
    pool, decisions = _pool(Policy.ROUND_ROBIN, a, b)
    assert collections.Counter(pool.pick("m").name for _ in range(10)) == {"a": 5, "b": 5}  # type: ignore[union-attr]
    assert decisions[0] == ("m", "round_robin", "balanced")


def test_load_aware_sees_load_the_gateway_did_not_send() -> None:
    now = time.monotonic()
    a = _b("a", load=UpstreamLoad(running=6, at=now))  # busy with another client's requests
    b = _b("b", load=UpstreamLoad(at=now))
    for policy, expect in ((Policy.LEAST_IN_FLIGHT, {"a", "b"}), (Policy.LOAD_AWARE, {"b"})):
        pool, _ = _pool(policy, a, b)
        assert {pool.pick("m").name for _ in range(6)} == expect, policy  # type: ignore[union-attr]
    pool, _ = _pool(Policy.LOAD_AWARE, _b("a", load=UpstreamLoad(kv_usage=0.9, at=now)),
                    _b("b", load=UpstreamLoad(kv_usage=0.1, at=now)))
    assert pool.pick("m").name == "b"  # type: ignore[union-attr]  # same requests, emptier cache


def test_prompt_text_covers_the_whole_message_list() -> None:
    one = prompt_text(_chat("hello"))
    two = prompt_text(_chat("hello", "hi there", "and now?"))
    assert two.startswith(one) and len(two) > len(one)
    parts = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "abc"}]}]}
    assert "abc" in prompt_text(parts)
    assert prompt_text({"model": "m", "prompt": ["first", "second"]}) == "first"
    assert prompt_text({"model": "m", "prompt": [1, 2, 3]}) == "1,2,3"
    assert prompt_text({"model": "m"}) == ""


def test_block_hashes_chain_so_a_shared_prefix_shares_hashes() -> None:
    x = "a" * BLOCK_CHARS * 3 + "tail"
    y = "a" * BLOCK_CHARS * 2 + "b" * BLOCK_CHARS
    hx, hy = block_hashes(x), block_hashes(y)
    assert len(hx) == 3 and hx[:2] == hy[:2] and hx[2] != hy[2]
    # Same third block, different history: a different hash (a prefix, not a bag of blocks).
    assert block_hashes("c" * BLOCK_CHARS + "a" * BLOCK_CHARS)[1] != block_hashes("a" * BLOCK_CHARS * 2)[1]
    assert block_hashes("short") == []


def test_prefix_index_finds_the_deepest_usable_holder_and_forgets() -> None:
    a, b = _b("a"), _b("b")
    idx = PrefixIndex(capacity=4)
    idx.record([1, 2, 3], a)
    idx.record([1, 2], b)
    assert idx.deepest([1, 2, 3, 9], [a, b]) == (3, [a])
    assert idx.deepest([1, 2, 3], [b]) == (2, [b])
    idx.record([7, 8], a)  # capacity 4: the least recently used (3) goes
    assert idx.deepest([1, 2, 3], [a, b])[0] == 2
    idx.forget(a)
    assert idx.deepest([7, 8], [a, b]) == (0, [])
    assert idx.deepest([1, 2], [a, b]) == (2, [b])


def test_prefix_aware_keeps_a_conversation_on_one_replica() -> None:
    a, b = _b("a"), _b("b")
    pool, decisions = _pool(Policy.PREFIX_AWARE, a, b)
    first = pool.pick("m", hint=hint_for(_chat("tell me about the sea " * 10), None))
    assert first is not None and decisions[-1][2] == PREFIX_MISS
    first.in_flight += 1  # its request is still open
    for turns in (("tell me about the sea " * 10, "the sea is big"), ("tell me about the sea " * 10, "x", "more")):
        assert pool.pick("m", hint=hint_for(_chat(*turns), None)) is first
        assert decisions[-1][2] == PREFIX_MATCH


def test_prefix_aware_spreads_when_the_holder_is_over_the_bound() -> None:
    a, b = _b("a"), _b("b")
    pool, decisions = _pool(Policy.PREFIX_AWARE, a, b, factor=1.25)
    hint = hint_for(_chat("same question " * 20), None)
    holder = pool.pick("m", hint=hint)
    assert holder is not None
    holder.in_flight = 3  # the other has 0: bound = ceil(1.25 * 4 / 2) = 3 < 3 + 1
    other = pool.pick("m", hint=hint)
    assert other is not None and other is not holder and decisions[-1][2] == OVERLOADED
    holder.in_flight = 1  # back under the bound: both hold the prefix now, the emptier wins
    assert pool.pick("m", hint=hint) is other and decisions[-1][2] == PREFIX_MATCH


def test_session_key_is_sticky_bounded_and_consistent() -> None:
    backends = [_b(n) for n in "abcd"]
    pool, decisions = _pool(Policy.PREFIX_AWARE, *backends)
    doc = _chat("hi")
    home = {s: pool.pick("m", hint=hint_for(doc, s)) for s in (f"s{i}" for i in range(40))}
    assert len({b.name for b in home.values() if b}) == 4  # the ring spreads sessions
    assert all(pool.pick("m", hint=hint_for(doc, s)) is b for s, b in home.items())
    assert decisions[-1][2] == SESSION
    # "user" in the body is a session key too; the header wins over it.
    assert pool.pick("m", hint=hint_for({**doc, "user": "s3"}, None)) is home["s3"]
    # One replica leaves rotation: only its sessions move.
    gone = home["s0"]
    assert gone is not None
    gone.state = "unhealthy"
    moved = {s for s, b in home.items() if pool.pick("m", hint=hint_for(doc, s)) is not b}
    assert moved == {s for s, b in home.items() if b is gone}
    # A home over the bound passes its session on, and says so.
    gone.state = S.HEALTHY
    gone.in_flight = 10
    assert pool.pick("m", hint=hint_for(doc, "s0")) is not gone and decisions[-1][2] == OVERLOADED


def test_ring_order_is_stable_across_processes() -> None:
    # blake2b points, not hash(): every gateway worker and every restart agrees.
    backends = [_b(n) for n in "abc"]
    order = [b.name for b in HashRing(backends).walk("session-42")]
    assert sorted(order) == ["a", "b", "c"]
    assert order == [b.name for b in HashRing(list(reversed(backends))).walk("session-42")]


@pytest.mark.parametrize("policy", list(Policy))
def test_every_policy_skips_excluded_and_out_of_rotation(policy: Policy) -> None:
    a, b, c = _b("a"), _b("b"), _b("c")
    c.state = "unhealthy"
    pool, _ = _pool(policy, a, b, c)
    hint = hint_for(_chat("q" * 300), None) if policy is Policy.PREFIX_AWARE else None
    assert {pool.pick("m", [a], hint) for _ in range(5)} == {b}
    assert pool.pick("m", [a, b], hint) is None
    assert pool.has_other("m", [a]) and not pool.has_other("m", [a, b])
