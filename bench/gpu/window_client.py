"""One side of a twin pass (twin_pairs.py): a closed loop of ``--conc`` streams against one server,
measured over a window of the monotonic clock that the other side measures over too.

    python3 bench/gpu/window_client.py --base URL --model NAME --tokenizer DIR --conc 512 \
        --t0 MONOTONIC --warmup 10 --window 30 --tail 10 --seed 1 --out side.json

The load is ``vllm bench serve``'s random 128/128 ``--ignore-eos`` (its ``vllm`` backend:
streamed ``/v1/completions``, each prompt random token ids decoded with the model's tokenizer, a
new one per request so that no two share a cached prefix), as a closed loop: each of the streams
sends its next request when its last one ends. What differs is when it is measured. ``vllm bench
serve`` runs a number of prompts and the pass lasts as long as they take; here both sides of a
twin pass start at ``t0`` and are measured over the same seconds [t0 + warmup, t0 + warmup +
window), whatever their speed, so that the host's state at that time is common to both. The loop
keeps running ``tail`` seconds past the window, so that requests sent late in the window get their
first token under the same load; then every stream is closed (the server aborts them).

``--ramp R`` starts the streams one by one over the first R seconds (stream i at t0 + R·i/conc)
instead of all at t0, as users would; the concurrency in steady state is the same. It was meant to
stop the waves of one request's life that the load moves in (results/twin-long-h200x2); it does
not: with the tiny model they re-form within seconds, the requests gathering in vLLM's API
server between engine passes (results/twin-waves-h200x2).

``--jitter-ms J`` makes each stream pause a random 0–J ms (uniform) before each of its next
requests: a direct side whose successors reach vLLM spread out, as a proxy spreads them by relaying
one request after another (twin_pairs.py's ``jb``/``ja`` passes). It takes J/2 ms per request out
of the loop on average, which ``mean_in_flight`` shows.

``--idle N`` opens N more connections to the server before the streams start, sends one
``GET /health`` on each and holds them idle to the end (``idle_held``: how many the server had not
closed by then): a direct side that presents vLLM as many connections as the gateway's warm pool
does on the other side (twin_pairs.py's ``i`` passes). With ``--conc 0`` the process only holds
them, from before t0 to the tail's end, and writes ``idle_held`` alone: the same connections at the
server, held by a process of their own instead of the client's loop (twin_pairs.py's ``h`` passes).

Figures: output tokens/s (tokens received inside the window ÷ its length, by vLLM's running
``completion_tokens`` in each chunk, which it adds with ``continuous_usage_stats``; a server without
it counts one per event), and how many tokens an event carried, TTFT p50/p99 of the requests sent
inside the window (one still waiting at the end counts as the slowest) and their mean, the median
and mean time to their response head (vLLM's server sends it when its handler returns the stream,
after parsing and tokenizing, before the stream asks the engine: TTFT's part before the engine),
the gaps between a stream's events inside the window, the mean life of the requests sent in it
that ended by the end of the tail (sent to the stream's end: a closed loop's request rate is conc
÷ that; biased short when a life is longer than the tail), the tokens of
each second of it and the TTFTs of the requests sent in each (twin_stats.py's sub-windows),
requests in flight (their summed time inside the window ÷ its length), errors, and this process's
CPU share over the window.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import re
import resource
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
from bench_clients import _pct as pct  # beside this file: run as a script

INPUT_LEN = OUTPUT_LEN = 128
# vLLM's running count in each chunk (stream_options.continuous_usage_stats): a chunk may carry
# several tokens once its API server falls behind the engine and merges deltas.
_USED = re.compile(rb'"completion_tokens":\s*(\d+)')
_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.I)
SPECIAL = 3  # the tiny tokenizer's <pad>, <s>, </s> (vllm_fleet/tinymodel.py): never drawn


class Side:
    """The window's tallies; every stamp is ``time.monotonic()``."""

    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, end
        self.tokens = 0
        self.events = 0
        # tokens in each second of the window: whether a longer window would narrow the spread
        # (twin_stats.py's sub-windows)
        self.per_second = [0] * max(1, math.ceil(end - start - 1e-6))  # 120 s, not 120.000001 s
        self.ttfts: list[float] = []
        # time to the response head of requests sent in the window: vLLM sends it once its API
        # server has parsed and tokenized the request, before the engine has it
        self.heads: list[float] = []
        self.lives: list[float] = []  # sent in the window -> the end of its stream, when it ended
        # each TTFT by the second it was sent in (ms): the same question for TTFT p50
        self.ttft_ms_each_second: list[list[int]] = [[] for _ in self.per_second]
        self.waiting: dict[int, float] = {}  # requests sent in the window, no first token yet: id -> sent
        self.gaps: list[float] = []
        self.busy = 0.0  # request-seconds inside the window
        self.errors = 0
        self.sent_in_window = 0

    def inside(self, t: float) -> bool:
        return self.start <= t < self.end

    def overlap(self, a: float, b: float) -> float:
        return max(0.0, min(b, self.end) - max(a, self.start))

    def second(self, t: float) -> int:
        return min(int(t - self.start), len(self.per_second) - 1)

    def first_token(self, sent: float, now: float) -> None:
        self.ttfts.append(now - sent)
        self.ttft_ms_each_second[self.second(sent)].append(round((now - sent) * 1000))

    def figures(self, until: float) -> dict[str, Any]:
        span = self.end - self.start
        # a request still without a first token at the end waited at least this long: the slowest
        ttfts = self.ttfts + [until - sent for sent in self.waiting.values()]
        each = [list(s) for s in self.ttft_ms_each_second]
        for sent in self.waiting.values():
            each[self.second(sent)].append(round((until - sent) * 1000))
        return {"output_throughput": round(self.tokens / span, 1),
                "median_ttft_ms": round(pct(ttfts, 50) * 1000, 1) if ttfts else None,
                "p99_ttft_ms": round(pct(ttfts, 99) * 1000, 1) if ttfts else None,
                "mean_ttft_ms": _mean_ms(ttfts),
                "median_head_ms": round(pct(self.heads, 50) * 1000, 1) if self.heads else None,
                "mean_head_ms": _mean_ms(self.heads), "mean_life_ms": _mean_ms(self.lives),
                "median_itl_ms": round(pct(self.gaps, 50) * 1000, 2) if self.gaps else None,
                "mean_itl_ms": _mean_ms(self.gaps, 2),
                "tokens_per_event": round(self.tokens / self.events, 3) if self.events else None,
                "mean_in_flight": round(self.busy / span, 1), "requests_in_window": self.sent_in_window,
                "no_first_token": len(self.waiting), "errors": self.errors, "tokens_each_second": self.per_second,
                "ttft_ms_each_second": each}


def _mean_ms(xs: list[float], places: int = 1) -> float | None:
    return round(sum(xs) / len(xs) * 1000, places) if xs else None


def prompts(tokenizer_dir: str, seed: int) -> Iterator[str]:
    """An endless run of prompts of ``INPUT_LEN`` tokens each, as vllm bench's random set makes them:
    random ids (the specials left out) decoded. Decoded text does not encode back to as many ids
    (the tiny tokenizer's merges make 158–215 of 128), so the ids are cut or topped up and the
    round trip tried again, up to ten times."""
    from tokenizers import Tokenizer  # the model's own; imported here, a few hundred ms

    tok = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
    rng = random.Random(seed)
    vocab = tok.get_vocab_size()
    while True:
        ids = [rng.randrange(SPECIAL, vocab) for _ in range(INPUT_LEN)]
        for _ in range(10):
            text = tok.decode(ids)
            ids = tok.encode(text, add_special_tokens=False).ids
            if len(ids) == INPUT_LEN:
                break
            ids = ids[:INPUT_LEN] + [rng.randrange(SPECIAL, vocab) for _ in range(INPUT_LEN - len(ids))]
        yield text


async def stream(http: aiohttp.ClientSession, url: str, body: dict[str, Any], rid: int, side: Side) -> None:
    sent = time.monotonic()
    counted = side.inside(sent)
    if counted:
        side.sent_in_window += 1
        side.waiting[rid] = sent
    last = None
    done = 0  # this stream's tokens so far
    try:
        async with http.post(url, json=body) as resp:
            if counted:
                side.heads.append(time.monotonic() - sent)
            if resp.status != 200:
                side.errors += 1
                side.waiting.pop(rid, None)
                return
            async for line in resp.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                used = _USED.search(line)
                new = int(used.group(1)) - done if used else 1
                if new <= 0:  # the closing usage-only chunk
                    continue
                done += new
                now = time.monotonic()
                if last is None:
                    if counted:
                        side.first_token(sent, now)
                        side.waiting.pop(rid, None)
                elif side.inside(last) and side.inside(now):
                    side.gaps.append(now - last)
                if side.inside(now):
                    side.tokens += new
                    side.events += 1
                    side.per_second[side.second(now)] += new
                last = now
        if counted:
            side.lives.append(time.monotonic() - sent)
    except aiohttp.ClientError:
        side.errors += 1
        side.waiting.pop(rid, None)
    finally:
        side.busy += side.overlap(sent, time.monotonic())


def start_delay(i: int, conc: int, ramp: float) -> float:
    """Seconds after t0 that stream ``i`` of ``conc`` sends its first request: evenly over the ramp."""
    return ramp * i / conc


async def hold_idle(base: str, n: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """``n`` more connections to the server, each after one keep-alive ``GET /health``, then left
    idle beside the streams: as the gateway's warm pool holds those its requests do not take
    (twin_pairs.py's ``i`` passes)."""
    u = urllib.parse.urlsplit(base)
    held = []
    for _ in range(n):
        r, w = await asyncio.open_connection(u.hostname, u.port)
        w.write(b"GET /health HTTP/1.1\r\nhost: %s\r\n\r\n" % u.netloc.encode())
        head = await r.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"GET /health on an idle connection answered {head[:40]!r}")
        # read its body too (vLLM's is empty), or at_eof() below could not see the server close it
        await r.readexactly(int(m.group(1)) if (m := _LENGTH.search(head)) else 0)
        held.append((r, w))
    return held


async def loop(a: argparse.Namespace) -> dict[str, Any]:
    side = Side(a.t0 + a.warmup, a.t0 + a.warmup + a.window)
    stop = side.end + a.tail
    texts = prompts(a.tokenizer, a.seed)
    url = a.base.rstrip("/") + "/v1/completions"
    ids = iter(range(1 << 62))
    pause = random.Random(a.seed).uniform

    async def worker(http: aiohttp.ClientSession, i: int) -> None:
        await asyncio.sleep(max(0.0, a.t0 + start_delay(i, a.conc, a.ramp) - time.monotonic()))
        while time.monotonic() < stop:
            body = {"model": a.model, "prompt": next(texts), "max_tokens": OUTPUT_LEN, "ignore_eos": True,
                    "temperature": 0.0, "stream": True,
                    "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
            await stream(http, url, body, next(ids), side)
            if a.jitter_ms:  # before the next request, which the loop's test may still call off
                await asyncio.sleep(pause(0.0, a.jitter_ms) / 1000)

    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    held = await hold_idle(a.base, a.idle)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as http:
        await asyncio.sleep(max(0.0, a.t0 - time.monotonic()))
        cpu0 = _cpu()
        tasks = [asyncio.create_task(worker(http, i)) for i in range(a.conc)]
        await asyncio.sleep(max(0.0, side.start - time.monotonic()))
        t_cpu0 = _cpu()
        await asyncio.sleep(max(0.0, side.end - time.monotonic()))
        cpu_window = _cpu() - t_cpu0
        await asyncio.sleep(max(0.0, stop - time.monotonic()))
        until = time.monotonic()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    idle = {"idle_held": sum(not r.at_eof() for r, _ in held)} if held else {}  # the server closed none?
    for _, w in held:
        w.close()
    return {**side.figures(until), **idle, "client_cpu_share": round(cpu_window / a.window, 3),
            "client_cpu_s": round(_cpu() - cpu0, 2)}


async def hold(a: argparse.Namespace) -> dict[str, Any]:
    """``--conc 0``: the idle connections alone, held through the pass as the client holds them."""
    held = await hold_idle(a.base, a.idle)
    await asyncio.sleep(max(0.0, a.t0 + a.warmup + a.window + a.tail - time.monotonic()))
    figures = {"idle_held": sum(not r.at_eof() for r, _ in held)}
    for _, w in held:
        w.close()
    return figures


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--model", required=True, help="the served model name to ask for")
    ap.add_argument("--tokenizer", required=True, help="a model directory with tokenizer.json")
    ap.add_argument("--conc", type=int, required=True, help="streams; 0: hold --idle connections only")
    ap.add_argument("--t0", type=float, required=True, help="time.monotonic() to start at (both sides alike)")
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--window", type=float, default=30.0)
    ap.add_argument("--tail", type=float, default=10.0)
    ap.add_argument("--ramp", type=float, default=0.0, help="seconds over which the streams start, one by one")
    ap.add_argument("--jitter-ms", type=float, default=0.0,
                    help="a random pause of 0 to this many ms before each stream's next request")
    ap.add_argument("--idle", type=int, default=0,
                    help="this many more connections, each used once (GET /health), held idle through the pass")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # a socket per stream: 1,024 streams pass 1,024 files
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    Path(a.out).write_text(json.dumps(asyncio.run(loop(a) if a.conc else hold(a)), indent=1))


if __name__ == "__main__":
    main()
