"""The relay's own CPU per relayed SSE chunk, without sockets: ``ClientRelay`` (every body before
stream migration, and non-migratable bodies still) against ``StreamRelay`` (streams that can continue
on another replica: whole events only, each chunk kept for the transcript, compacted at 64 KiB).

Each relay is driven as the upstream parser drives it, with a ``send`` that finishes without
suspending (uvicorn's, while the client keeps up). Streams of ``--events`` vLLM-shaped chat chunks
(default 100, as bench/compare's paced phase; 2,000 crosses the compaction bound several times),
best of ``--repeat`` runs, interleaved. Also times what each request adds: the plan (a look at the
parsed body) and the registration of the stream on its backend, and the compaction of a 64 KiB
batch of plain tokens (what a long stream pays per event past the first 64 KiB).

Then the same ``StreamRelay`` with a real server behind it: uvicorn's ``send`` of a started chunked
response (the ASGI path) against the gateway protocol's own chunk write (coalesce.BodyWrite) of
the same response, into a transport that only counts bytes.

    .venv/bin/python bench/relay/cost.py [--events 100] [--streams 2000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gateway.coalesce import BodyWrite
from gateway.migration import plan_for
from gateway.relay import ClientRelay, StreamRelay
from gateway.sse import Transcript


async def _send(_: Any) -> None:
    return None


def _events(n: int) -> list[bytes]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        doc = {"id": "chatcmpl-0123456789abcdef", "object": "chat.completion.chunk", "created": 1700000000,
               "model": "m", "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"

    return [chunk({"role": "assistant", "content": ""})] + [chunk({"content": f" tok{i}"}) for i in range(n)]


def _plain(events: list[bytes], streams: int) -> float:
    t = time.perf_counter()
    for _ in range(streams):
        relay = ClientRelay(_send, _noop)
        for e in events:
            relay(e)
    return time.perf_counter() - t


def _recorded(events: list[bytes], streams: int) -> float:
    t = time.perf_counter()
    for _ in range(streams):
        relay = StreamRelay(_send, _noop, Transcript(True))
        for e in events:
            relay(e)
    return time.perf_counter() - t


class _Counting:
    """A transport that takes every write and counts its bytes."""

    def __init__(self) -> None:
        self.n = 0

    def write(self, data: bytes) -> None:
        self.n += len(data)

    def is_closing(self) -> bool:
        return False


def _started_cycle() -> Any:
    """uvicorn's request cycle with a chunked response head already sent."""
    import logging

    from uvicorn.protocols.http.flow_control import FlowControl
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

    t: Any = _Counting()
    c = RequestResponseCycle(scope={"type": "http", "method": "POST"}, transport=t, flow=FlowControl(t),  # type: ignore[typeddict-item]
                             logger=logging.getLogger("cost"), access_logger=logging.getLogger("cost"),
                             access_log=False, default_headers=[], message_event=asyncio.Event(),
                             expect_100_continue=False, keep_alive=True, on_response=_noop)
    c.response_started, c.chunked_encoding = True, True
    return c


def _served(events: list[bytes], streams: int, own_write: bool) -> float:
    t = time.perf_counter()
    for _ in range(streams):
        c = _started_cycle()
        relay = StreamRelay(c.send, _noop, Transcript(True), BodyWrite(c) if own_write else None)
        for e in events:
            relay(e)
    return time.perf_counter() - t


def _per_request(streams: int) -> float:
    doc = {"model": "m", "stream": True, "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}
    registry: dict[object, set[object]] = {}
    backend = object()
    t = time.perf_counter()
    for _ in range(streams):
        plan = plan_for("/v1/chat/completions", doc, 2)
        s = object()
        registry.setdefault(backend, set()).add(s)  # what stream.Streams.on/off do
        registry[backend].discard(s)
        if not registry[backend]:
            del registry[backend]
        assert plan is not None
    return time.perf_counter() - t


def _noop() -> None:
    return None


class _EventByEvent(Transcript):
    __slots__ = ()

    def _plain_batch(self, data: bytes) -> bool:
        return False


def _compaction(events: list[bytes], cls: type[Transcript]) -> float:
    """Seconds per event to compact a 64 KiB batch of plain tokens, after the first batch."""
    plain = [e for e in events[1:] if b'"finish_reason":null' in e]
    t = cls(True)
    t.kept.extend(events[:2])
    t.compact()
    t.kept.extend(plain)
    start = time.perf_counter()
    t.compact()
    return (time.perf_counter() - start) / len(plain)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=100)
    p.add_argument("--streams", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=7)
    a = p.parse_args()
    events = _events(a.events)
    n = a.streams * len(events)
    plain, recorded, request, by_send, by_write = [], [], [], [], []
    for _ in range(a.repeat):
        plain.append(_plain(events, a.streams) / n)
        recorded.append(_recorded(events, a.streams) / n)
        request.append(_per_request(a.streams) / a.streams)
        by_send.append(_served(events, a.streams, False) / n)
        by_write.append(_served(events, a.streams, True) / n)
    p_ns, r_ns = min(plain) * 1e9, min(recorded) * 1e9
    print(f"{a.events} events per stream, {a.streams} streams, best of {a.repeat}:")
    print(f"  ClientRelay  {p_ns:7.0f} ns per chunk")
    print(f"  StreamRelay  {r_ns:7.0f} ns per chunk  (+{r_ns - p_ns:.0f} ns)")
    print(f"  per request: plan + registration {min(request) * 1e9:.0f} ns")
    batch = _events(64 * 1024 // len(events[-1]))
    one = min(_compaction(batch, Transcript) for _ in range(a.repeat * 3)) * 1e9
    each = min(_compaction(batch, _EventByEvent) for _ in range(a.repeat * 3)) * 1e9
    print(f"  compaction of a 64 KiB batch: {one:.0f} ns per event (event by event: {each:.0f} ns)")
    s_ns, w_ns = min(by_send) * 1e9, min(by_write) * 1e9
    print(f"  StreamRelay into uvicorn's send     {s_ns:7.0f} ns per chunk")
    print(f"  StreamRelay into the own chunk write {w_ns:7.0f} ns per chunk  ({w_ns - s_ns:+.0f} ns, "
          f"{w_ns / s_ns:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
