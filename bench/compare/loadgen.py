"""The load generator: aiohttp on uvloop, every phase bounded both in count and in wall time.

Latency is measured from just before the request is sent to the last byte of the body (non-
streaming), or to the first SSE event (TTFT). Inter-token latency is the gap between successive
SSE events as the client sees them: an event that arrives in the same read as the previous one
has a gap of 0, so coalescing by a proxy shows up in the distribution instead of hiding it.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import aiohttp

CHAT = "/v1/chat/completions"


def body(model: str, max_tokens: int, stream: bool) -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": "Say hello."}],
                       "max_tokens": max_tokens, "stream": stream}).encode()


HEADERS = {"content-type": "application/json", "authorization": "Bearer none"}


@dataclass
class Result:
    latencies: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    events: int = 0
    done: int = 0
    errors: int = 0
    first_error: str = ""
    wall: float = 0.0
    timed_out: bool = False

    def fail(self, e: object) -> None:
        self.errors += 1
        self.first_error = self.first_error or str(e)[:200]


def _session(limit: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit, force_close=False),
                                 timeout=aiohttp.ClientTimeout(total=120))


async def _one(s: aiohttp.ClientSession, url: str, data: bytes, res: Result) -> None:
    t = time.perf_counter()
    try:
        async with s.post(url + CHAT, data=data, headers=HEADERS) as r:
            await r.read()
            if r.status != 200:
                res.fail(f"status {r.status}")
                return
    except (TimeoutError, aiohttp.ClientError) as e:
        res.fail(repr(e))
        return
    res.latencies.append(time.perf_counter() - t)
    res.done += 1


async def requests(url: str, n: int, conc: int, time_limit: float, warmup: int = 50) -> Result:
    """``n`` non-streaming requests by ``conc`` workers, stopping early at ``time_limit`` s."""
    res, warm = Result(), Result()
    data = body("m", 16, False)
    async with _session(conc) as s:
        for _ in range(max(1, warmup // conc)):  # opens every connection the phase will use
            await asyncio.gather(*(_one(s, url, data, warm) for _ in range(conc)))
        if warm.errors:
            res.fail(f"warm-up: {warm.first_error}")
            return res
        todo = iter(range(n))
        t0 = time.perf_counter()
        stop_at = t0 + time_limit

        async def worker() -> None:
            for _ in todo:
                if time.perf_counter() > stop_at:
                    res.timed_out = True
                    return
                await _one(s, url, data, res)

        try:
            await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(conc))), time_limit + 30)
        except TimeoutError:
            res.timed_out = True
        res.wall = time.perf_counter() - t0
    return res


async def _stream(s: aiohttp.ClientSession, url: str, data: bytes, res: Result) -> None:
    t = time.perf_counter()
    last = 0.0
    tail = b""
    got = 0
    try:
        async with s.post(url + CHAT, data=data, headers=HEADERS) as r:
            if r.status != 200:
                res.fail(f"status {r.status}: {(await r.read())[:100]!r}")
                return
            async for chunk in r.content.iter_any():
                now = time.perf_counter()
                k = (tail + chunk).count(b"\n\n")
                tail = chunk[-1:]
                if not k:
                    continue
                if got == 0:
                    res.ttft.append(now - t)
                else:
                    res.itl.append(now - last)
                res.itl.extend([0.0] * (k - 1))
                got += k
                last = now
    except (TimeoutError, aiohttp.ClientError) as e:
        res.fail(repr(e))
        return
    finally:
        res.events += got
    res.done += 1


async def streams(url: str, model: str, conc: int, tokens: int, rounds: int, stagger_s: float,
                  time_limit: float) -> Result:
    """``conc`` workers each run ``rounds`` streams one after another; worker i starts after
    i/conc of ``stagger_s``, so that stream starts are spread out."""
    res = Result()
    data = body(model, tokens, True)
    async with _session(conc) as s:
        warm = Result()  # opens every connection the phase will use, through the proxy too
        await asyncio.gather(*(_stream(s, url, body("m", 4, True), warm) for _ in range(conc)))
        if warm.errors or not warm.events:
            res.fail(f"warm-up: {warm.first_error or 'no events'}")
            return res
        t0 = time.perf_counter()

        async def worker(i: int) -> None:
            await asyncio.sleep(stagger_s * i / conc)
            for _ in range(rounds):
                await _stream(s, url, data, res)

        tasks = [asyncio.ensure_future(worker(i)) for i in range(conc)]
        _, pending = await asyncio.wait(tasks, timeout=time_limit)
        if pending:
            res.timed_out = True
            for p in pending:
                p.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        res.wall = time.perf_counter() - t0
    return res
