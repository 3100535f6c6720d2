"""What a vLLM server says about its own load (from its /metrics), and what routing makes of it.

Pure data and arithmetic, below ``backend.py`` in the import order: the scraper (loadscrape.py)
writes a backend's ``load``, routing (routing.py) reads it. The gateway's own in-flight count
(every worker's, from the shared table) is exact and immediate; the scrape adds what the gateway
cannot see (requests from other clients, the engine's queue, KV-cache pressure) with up to one
interval of delay. A scrape older than ``STALE_INTERVALS`` intervals (the backend stopped answering
/metrics) is ignored and routing falls back to in-flight counts alone.

So is a scrape whose requests make no progress: running or waiting above 0 while the token counters
have not moved for ``STALL_INTERVALS`` intervals. vLLM with several API servers
(``--api-server-count 2``) can leave ``num_requests_running`` at the count of the requests cut off
at once (clients gone) and hold it there, the counters flat, until its next request: 16 of 93
cuts of 512 streams on an H200 (bench/gpu/results/cut-gauges-h200, cut-pair-h200). Believed, that
phantom load would keep load-aware routing off the replica, and so keep the next request, the one
that clears it, away for good. A replica that runs anything moves its counters every engine step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol


class Loaded(Protocol):
    """What the load arithmetic reads of a backend (its in-flight count comes as an argument: with
    several workers it is the sum over them, which only the caller can read)."""

    load: UpstreamLoad | None


STALE_INTERVALS = 3
STALL_INTERVALS = 5
# vLLM ≥ 0.10 calls the KV-cache gauge kv_cache_usage_perc; older releases gpu_cache_usage_perc.
_SERIES = {
    b"vllm:num_requests_running": "running",
    b"vllm:num_requests_waiting": "waiting",
    b"vllm:kv_cache_usage_perc": "kv_usage",
    b"vllm:gpu_cache_usage_perc": "kv_usage",
    b"vllm:prefix_cache_hits_total": "prefix_hits",
    b"vllm:prefix_cache_queries_total": "prefix_queries",
    b"vllm:prompt_tokens_total": "tokens",
    b"vllm:generation_tokens_total": "tokens",
}


@dataclass(frozen=True)
class UpstreamLoad:
    running: float = 0.0  # summed over the server's label sets (models, engines)
    waiting: float = 0.0
    kv_usage: float = 0.0  # 0..1, the largest over engines
    prefix_hits: float = 0.0  # counters since the server started (tokens)
    prefix_queries: float = 0.0
    at: float = 0.0  # monotonic time of the scrape
    gateway_in_flight: int = 0  # the gateway's in-flight count (every worker's) when the scrape arrived
    tokens: float | None = None  # prompt + generated tokens since the server started; None: not exposed
    flat_since: float = 0.0  # busy with the counters still since this time (settle); 0 when not busy
    stalled: bool = False  # busy, counters flat for STALL_INTERVALS: not believed (_fresh)


def parse_load(text: bytes, at: float = 0.0, gateway_in_flight: int = 0) -> UpstreamLoad:
    """The routing signals in a Prometheus text exposition; series it lacks count as 0.

    A line scan, not a full parser: vLLM's exposition is mostly histogram buckets, which a real
    parser would build objects for and routing never reads."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(b"vllm:"):
            continue
        end = line.find(b"{")
        name = line[:end] if end >= 0 else line.split(b" ", 1)[0]
        field = _SERIES.get(name)
        if field is None:
            continue
        try:
            value = float(line.rsplit(b" ", 1)[1])
        except (IndexError, ValueError):
            continue
        if value != value:  # NaN
            continue
        if field == "kv_usage":
            found[field] = max(found.get(field, 0.0), value)
        else:
            found[field] = found.get(field, 0.0) + value
    g = found.get
    return UpstreamLoad(running=g("running", 0.0), waiting=g("waiting", 0.0), kv_usage=g("kv_usage", 0.0),
                        prefix_hits=g("prefix_hits", 0.0), prefix_queries=g("prefix_queries", 0.0), at=at,
                        gateway_in_flight=gateway_in_flight, tokens=g("tokens"))


def settle(last: UpstreamLoad | None, new: UpstreamLoad, stall_after: float) -> UpstreamLoad:
    """``new`` judged against the backend's ``last`` scrape: stalled once it has been busy with its
    token counters flat for ``stall_after`` seconds. A backend that exposes no counters is never."""
    if new.tokens is None or new.running + new.waiting <= 0:
        return new
    flat = last is not None and last.running + last.waiting > 0 and last.tokens == new.tokens
    since = last.flat_since if flat and last is not None else new.at
    return replace(new, flat_since=since, stalled=new.at - since >= stall_after)


def _fresh(b: Loaded, now: float, max_age: float) -> UpstreamLoad | None:
    u = b.load
    return u if u is not None and not u.stalled and now - u.at <= max_age else None


def load_estimate(b: Loaded, in_flight: int, now: float, max_age: float) -> float:
    """Requests on the backend now: ``in_flight``, the gateway's own, plus those the last fresh
    scrape saw beyond the gateway's own at that moment (other clients)."""
    u = _fresh(b, now, max_age)
    if u is None:
        return float(in_flight)
    return in_flight + max(0.0, u.running + u.waiting - u.gateway_in_flight)


# A full KV cache weighs like this many extra requests: near it vLLM preempts and recomputes.
KV_WEIGHT = 4.0


def load_score(b: Loaded, in_flight: int, now: float, max_age: float) -> float:
    """Lower is better. The estimate above, plus the engine's queue once more (queued requests
    mean the replica is saturated, not just busy) and the KV-cache pressure."""
    u = _fresh(b, now, max_age)
    base = load_estimate(b, in_flight, now, max_age)
    return base if u is None else base + u.waiting + KV_WEIGHT * u.kv_usage
