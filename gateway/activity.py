"""The gateway's own record of recent requests, for the web console (no Prometheus needed).

Two views of the same requests: the last ``RECENT`` of them (time, model, replica, status,
latency, time to first byte) and, per model, ten-second buckets over the last five minutes (count,
errors, TTFB samples) from which the console draws req/s and TTFB p50/p99.

The proxy's call sites already report each request's outcome to GatewayMetrics exactly once
(``count``) and its first byte (``observe_ttfb``); rather than threading an object through the
opener, the stream relay and every error path, the proxy opens an ``Entry`` in a context
variable for the request's task and those two calls fill it in. The cost on the hot path is one
ContextVar set, a small object, and a deque append when the request ends (bench: docs/console.md).
No prompt or answer text is kept unless the operator turns on ``FLEET_CONSOLE_PROMPTS``: then the
first ``PROMPT_CHARS`` of each request's last message, shown to admin keys only.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

RECENT = 200  # requests kept for the Activity table
BUCKET_S = 10.0
BUCKETS = 30  # five minutes of ten-second buckets per model
_SAMPLES = 256  # TTFB samples kept per bucket: enough for a p99, bounded under any load
PROMPT_CHARS = 200


class Entry:
    __slots__ = ("backend", "count_tokens", "model", "prompt", "start", "status", "tokens", "ttfb", "wall")

    def __init__(self) -> None:
        self.wall = time.time()
        self.start = time.perf_counter()
        self.model = ""
        self.backend = ""
        self.status: int | str = 0
        self.ttfb: float | None = None
        self.prompt: str | None = None
        self.tokens: int | None = None  # completion tokens, where the answer says or the stream was counted
        self.count_tokens: Callable[[], int | None] | None = None  # the count, worked out when read

    def counted_tokens(self) -> int | None:
        if self.tokens is None and self.count_tokens is not None:
            self.tokens, self.count_tokens = self.count_tokens(), None
        return self.tokens


_COMPLETION_TOKENS = re.compile(rb'"completion_tokens":\s*(\d+)')


def completion_tokens(body: bytes) -> int | None:
    """``usage.completion_tokens`` of a whole (non-streamed) answer, found without parsing the JSON:
    the body may be large, and a search for one key costs less than a parse on the hot path."""
    m = _COMPLETION_TOKENS.search(body)
    return int(m.group(1)) if m else None


LAZY_BYTES = 64 * 1024


def record_tokens_later(count: Callable[[], int | None], size: int = 0) -> None:
    """The current request's completion tokens, counted only if the console reads them. Counting a
    stream means parsing every event: 43 % of the gateway's CPU (py-spy) under bench/compare's
    burst load, whose short streams arrive whole. ``count`` holds the answer's bytes until then;
    an answer of more than ``LAZY_BYTES`` is counted now, so the ``RECENT`` entries hold at most
    RECENT × LAZY_BYTES (a stream's transcript keeps less: relay.COMPACT_BYTES)."""
    entry = CURRENT.get()
    if entry is None:
        return
    if size > LAZY_BYTES:
        entry.tokens = count()
    else:
        entry.count_tokens = count


def prompt_excerpt(doc: dict[str, Any]) -> str:
    """The start of the last message (chat) or of the prompt (completions); "" when neither is text."""
    text: Any = doc.get("prompt")
    messages = doc.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        text = messages[-1].get("content")
        if isinstance(text, list):  # content parts: the text ones
            text = " ".join(p.get("text", "") for p in text if isinstance(p, dict) and isinstance(p.get("text"), str))
    return text[:PROMPT_CHARS] if isinstance(text, str) else ""


CURRENT: ContextVar[Entry | None] = ContextVar("fleet_request", default=None)


class _Bucket:
    __slots__ = ("count", "errors", "start", "ttfbs")

    def __init__(self, start: float) -> None:
        self.start = start
        self.count = 0
        self.errors = 0
        self.ttfbs: list[float] = []


def _pct(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


class Activity:
    def __init__(self) -> None:
        self.recent: deque[tuple[Entry, float]] = deque(maxlen=RECENT)
        self._series: dict[str, deque[_Bucket]] = {}

    def begin(self) -> Entry:
        entry = Entry()
        CURRENT.set(entry)
        return entry

    def end(self, entry: Entry) -> None:
        """The request's task is done: keep it, unless no outcome was reported (never routed)."""
        if not entry.status:
            return
        latency = time.perf_counter() - entry.start
        self.recent.append((entry, latency))
        ring = self._series.get(entry.model)
        if ring is None:
            ring = self._series[entry.model] = deque(maxlen=BUCKETS)
        start = entry.wall - entry.wall % BUCKET_S
        if not ring or ring[-1].start != start:
            ring.append(_Bucket(start))
        bucket = ring[-1]
        bucket.count += 1
        if not (isinstance(entry.status, int) and entry.status < 400):
            bucket.errors += 1
        if entry.ttfb is not None and len(bucket.ttfbs) < _SAMPLES:
            bucket.ttfbs.append(entry.ttfb)

    # -- reads (the console's JSON) ---------------------------------------------------------------

    def requests(self, limit: int = RECENT, prompts: bool = False) -> list[dict[str, Any]]:
        return [{"time": round(e.wall, 3), "model": e.model, "backend": e.backend, "status": e.status,
                 "latency_s": round(lat, 4), "ttfb_s": None if e.ttfb is None else round(e.ttfb, 4),
                 "tokens": e.counted_tokens(),
                 **({"prompt": e.prompt} if prompts else {})}
                for e, lat in list(self.recent)[-limit:][::-1]]

    def series(self, now: float | None = None) -> dict[str, dict[str, Any]]:
        """Per model: bucket starts, req/s, errors, TTFB p50/p99 (s), oldest first, with empty
        buckets filled in so a chart's x axis is time."""
        now = time.time() if now is None else now
        last = now - now % BUCKET_S
        starts = [last - BUCKET_S * i for i in range(BUCKETS - 1, -1, -1)]
        out: dict[str, dict[str, Any]] = {}
        for model, ring in self._series.items():
            by_start = {b.start: b for b in ring}
            rate, errors, p50, p99 = [], [], [], []
            for s in starts:
                b = by_start.get(s)
                ttfbs = sorted(b.ttfbs) if b else []
                # The current bucket is partly over: its rate is over the part elapsed.
                span = (now - s) if s == last else BUCKET_S
                rate.append(round(b.count / max(span, 1.0), 3) if b else 0.0)
                errors.append(b.errors if b else 0)
                p50.append(_pct(ttfbs, 0.5))
                p99.append(_pct(ttfbs, 0.99))
            out[model] = {"start": starts, "bucket_s": BUCKET_S, "req_per_s": rate, "errors": errors,
                          "ttfb_p50_s": p50, "ttfb_p99_s": p99}
        return out
