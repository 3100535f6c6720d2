"""How many tokens a replica makes of the text a broken stream already relayed: vLLM's
``POST /tokenize`` on a replica of the model, asked once per splice (docs/stream-failover.md).

The transcript's own count (sse.py: one token per event) is exact only while vLLM's API server keeps
up with its engine: when it falls behind (a busy API-server process, or a slow client whose
backpressure stops its writes) vLLM v1 merges the pending deltas of a request into one event, so
events undercount tokens. Re-tokenizing the text undercounts differently (a model may generate a
split the tokenizer would merge) but does not depend on timing, and it is what the continuation's
replica will count when it checks ``prompt + max_tokens`` against the model's context. The stream
uses the larger of the two, so the continuation never asks for more than the client's budget.

One round trip to a replica that is about to take the continuation anyway (its connection goes back
to the pool and usually carries the continuation next); bounded by ``TIMEOUT_S``; any failure
(not vLLM, an old vLLM without the route, a timeout) leaves the transcript's count alone.
"""

from __future__ import annotations

import asyncio
import json

from gateway.backend import Backend
from gateway.connection import UpstreamError
from gateway.upstream import UpstreamPool

TIMEOUT_S = 1.0
_MAX_BODY = 1 << 20  # the answer is a count and a token list; refuse anything far larger


async def tokens_of(upstream: UpstreamPool, backend: Backend, model: str, text: str,
                    upstream_key: bytes | None, deadline: float) -> int | None:
    """The token count ``backend`` gives ``text`` (no special tokens added), or None."""
    body = json.dumps({"model": model, "prompt": text, "add_special_tokens": False}).encode()
    headers = b"content-type: application/json\r\n"
    if upstream_key:
        headers += b"authorization: Bearer " + upstream_key + b"\r\n"
    loop = asyncio.get_running_loop()
    deadline = min(deadline, loop.time() + TIMEOUT_S)
    origin, request = upstream.request(backend.url, b"/tokenize", headers, body)
    try:
        conn = await upstream.send(origin, request, deadline)
    except (UpstreamError, TimeoutError):
        return None
    parts: list[bytes] = []
    try:
        if conn.status != 200:
            return None
        if conn.complete:
            parts.append(conn.take_body())
        else:
            def take(chunk: bytes) -> bool:
                parts.append(chunk)
                return sum(map(len, parts)) < _MAX_BODY

            conn.attach(take)
            if not await conn.body_end(TIMEOUT_S, deadline):
                return None  # the sink refused more: far larger than a tokenize answer
        count = json.loads(b"".join(parts)).get("count")
    except (UpstreamError, TimeoutError, ValueError, AttributeError):
        return None
    finally:
        upstream.release(conn, origin)
    return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else None
