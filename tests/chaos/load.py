"""Closed-loop load for the chaos suite and the soak: N clients, each sending one request after
another until a deadline, every request bounded by a client-side timeout, every outcome counted.

Outcomes (the keys of ``Tally.outcomes``):

- ``ok``: a 200 whose body is a complete JSON completion (non-streaming), or a stream that ended
  with ``data: [DONE]`` and no error event;
- ``error_event``: a stream that carried the gateway's OpenAI error event and then lost its
  connection without ``[DONE]`` (the documented mid-stream failure);
- ``http_<status>:<code>``: an answer that was not 200, with the envelope's ``code`` (``-`` when
  the body is not the envelope); ``gw`` is appended when the gateway itself produced a 5xx (no
  ``x-fleet-backend`` header);
- ``truncated``: a stream or body that ended without ``[DONE]`` and without an error event (what
  the gateway must never produce);
- ``client_timeout``: no complete answer within the client's timeout (a hang);
- ``exc:<Class>``: any other client-side failure (connection refused, reset...).
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

OK = "ok"
ERROR_EVENT = "error_event"
TRUNCATED = "truncated"
CLIENT_TIMEOUT = "client_timeout"


@dataclass
class Tally:
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    latencies: list[float] = field(default_factory=list)  # seconds, every request whatever its outcome
    backends: collections.Counter[str] = field(default_factory=collections.Counter)
    samples: dict[str, str] = field(default_factory=dict)  # first detail seen per outcome kind
    # Streams that changed replica midway (the chunks' system_fingerprint changed): the silence the
    # client saw at the splice, last event of one replica to first event of the next (seconds).
    splice_gaps: list[float] = field(default_factory=list)

    def add(self, kind: str, latency: float, backend: str | None = None, detail: str = "") -> None:
        self.outcomes[kind] += 1
        self.latencies.append(latency)
        if backend:
            self.backends[backend] += 1
        if kind != OK and kind not in self.samples:
            self.samples[kind] = detail[:300]

    @property
    def total(self) -> int:
        return sum(self.outcomes.values())

    def failures(self) -> dict[str, int]:
        return {k: v for k, v in self.outcomes.items() if k != OK}

    def pct(self, q: float) -> float:
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0

    def summary(self) -> dict[str, Any]:
        out = {"requests": self.total, "outcomes": dict(self.outcomes), "backends": dict(self.backends),
               "p50_s": round(self.pct(0.50), 4), "p99_s": round(self.pct(0.99), 4),
               "max_s": round(max(self.latencies, default=0.0), 4), "samples": self.samples}
        if self.splice_gaps:
            gaps = sorted(self.splice_gaps)
            out["splices"] = {"count": len(gaps), "p50_s": round(gaps[len(gaps) // 2], 4),
                              "p99_s": round(gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))], 4),
                              "max_s": round(gaps[-1], 4)}
        return out


def _fingerprint(line: bytes) -> bytes | None:
    i = line.find(b'"system_fingerprint":"')
    if i < 0:
        return None
    i += 22
    return line[i:line.find(b'"', i)]


def _error_kind(status: int, body: bytes, headers: Any) -> tuple[str, str]:
    code: object = "-"
    try:
        doc = json.loads(body)
        if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
            code = doc["error"].get("code")
    except ValueError:
        pass
    kind = f"http_{status}:{code}"
    if status >= 500 and "x-fleet-backend" not in headers:
        kind += ":gw"
    return kind, body[:300].decode(errors="replace")


async def one_request(session: aiohttp.ClientSession, url: str, body: dict[str, Any], limit_s: float,
                      tally: Tally) -> None:
    """One request through ``url`` (the gateway's base URL), its outcome added to ``tally``."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    t0 = time.perf_counter()
    backend: str | None = None
    seen_done = seen_error = False
    try:
        async with asyncio.timeout(limit_s), session.post(url + path, json=body) as r:
            backend = r.headers.get("x-fleet-backend")
            if r.status != 200:
                kind, detail = _error_kind(r.status, await r.read(), r.headers)
                tally.add(kind, time.perf_counter() - t0, backend, detail)
                return
            if not body.get("stream"):
                raw = await r.read()
                try:
                    ok = bool(json.loads(raw).get("choices"))
                except ValueError:
                    ok = False
                detail = raw[:300].decode(errors="replace")
                tally.add(OK if ok else TRUNCATED, time.perf_counter() - t0, backend, detail)
                return
            made_by: bytes | None = None  # the replica that made the last event, and when it came
            last = 0.0
            try:
                async for line in r.content:
                    if line.startswith(b"data: [DONE]"):
                        seen_done = True
                    elif line.startswith(b'data: {"error"'):
                        seen_error = True
                    elif line.startswith(b"data: {") and (fp := _fingerprint(line)) is not None:
                        now = time.perf_counter()
                        if made_by is not None and fp != made_by:
                            tally.splice_gaps.append(now - last)
                        made_by, last = fp, now
            except aiohttp.ClientPayloadError:
                pass  # the connection was dropped mid-body; judged below by what arrived
            if seen_error and not seen_done:
                tally.add(ERROR_EVENT, time.perf_counter() - t0, backend)
            elif seen_done and not seen_error:
                tally.add(OK, time.perf_counter() - t0, backend)
            else:
                tally.add(TRUNCATED, time.perf_counter() - t0, backend, f"done={seen_done} error={seen_error}")
    except TimeoutError:
        tally.add(CLIENT_TIMEOUT, time.perf_counter() - t0, backend, f"after {limit_s}s")
    except aiohttp.ClientError as e:
        tally.add(f"exc:{e.__class__.__name__}", time.perf_counter() - t0, backend, repr(e))


async def closed_loop(url: str, clients: int, seconds: float, bodies: list[dict[str, Any]], limit_s: float,
                      tally: Tally, max_requests: int = 100_000) -> None:
    """``clients`` workers, each cycling through ``bodies``, until ``seconds`` pass or
    ``max_requests`` have started; each request bounded by ``limit_s``. One connection pool per
    run, keep-alive like a real client."""
    deadline = time.monotonic() + seconds
    started = 0
    connector = aiohttp.TCPConnector(limit=clients, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker(i: int) -> None:
            nonlocal started
            k = i
            while time.monotonic() < deadline and started < max_requests:
                started += 1
                await one_request(session, url, bodies[k % len(bodies)], limit_s, tally)
                k += 1

        await asyncio.gather(*(worker(i) for i in range(clients)))


async def configure(fake_url: str, **knobs: Any) -> None:
    """The fake's live knobs, from inside an event loop."""
    async with aiohttp.ClientSession() as s, s.post(fake_url + "/_fake/config", json=knobs,
                                                    timeout=aiohttp.ClientTimeout(total=5)) as r:
        r.raise_for_status()
