"""What a vLLM server says about its own load (from its /metrics), and what routing makes of it.

Pure data and arithmetic, below ``backend.py`` in the import order: the scraper (loadscrape.py)
writes a backend's ``load``, routing (routing.py) reads it. The gateway's own in-flight count
(every worker's, from the shared table) is exact and immediate; the scrape adds what the gateway
cannot see (requests from other clients, the engine's queue, KV-cache pressure) with up to one
interval of delay. A scrape older than ``STALE_INTERVALS`` intervals (the backend stopped answering
/metrics) is ignored and routing falls back to in-flight counts alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class Loaded(Protocol):
    """What the load arithmetic reads of a backend (its in-flight count comes as an argument: with
    several workers it is the sum over them, which only the caller can read)."""

    load: UpstreamLoad | None


STALE_INTERVALS = 3
# vLLM ≥ 0.10 calls the KV-cache gauge kv_cache_usage_perc; older releases gpu_cache_usage_perc.
_SERIES = {
    b"vllm:num_requests_running": "running",
    b"vllm:num_requests_waiting": "waiting",
    b"vllm:kv_cache_usage_perc": "kv_usage",
    b"vllm:gpu_cache_usage_perc": "kv_usage",
    b"vllm:prefix_cache_hits_total": "prefix_hits",
    b"vllm:prefix_cache_queries_total": "prefix_queries",
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
    return UpstreamLoad(at=at, gateway_in_flight=gateway_in_flight, **found)


def _fresh(b: Loaded, now: float, max_age: float) -> UpstreamLoad | None:
    u = b.load
    return u if u is not None and now - u.at <= max_age else None


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
