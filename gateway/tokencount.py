"""How many tokens a replica makes of the text a broken stream already relayed, and of the
original request's prompt: vLLM's ``POST /tokenize`` on a replica of the model, asked at a splice
(docs/stream-failover.md).

The transcript's own count (sse.py: one token per event) is exact only while vLLM's API server keeps
up with its engine: when it falls behind (a busy API-server process, or a slow client whose
backpressure stops its writes) vLLM v1 merges the pending deltas of a request into one event, so
events undercount tokens. Re-tokenizing the text undercounts differently (a model may generate a
split the tokenizer would merge) but does not depend on timing, and it is what the continuation's
replica will count when it checks ``prompt + max_tokens`` against the model's context. The stream
uses the larger of the two, so the continuation never asks for more than the client's budget.

The prompt's count is what the client's usage reports as ``prompt_tokens`` when the stream had
carried no usage before it broke. Otherwise the only count at hand is the continuation's, less the
tokens handed back, which re-tokenizing the text can put off by a few (24 for 27 in one real-vLLM
run). ``/tokenize`` renders a chat request's messages with the same template options as a chat
completion, so on vLLM 0.32 its count equalled the completion's ``prompt_tokens`` exactly (27 = 27,
47 = 47 for chat; 5 = 5 for a text prompt).

Round trips to a replica that is about to take the continuation anyway (their connections go back
to the pool and usually carry the continuation next); bounded by ``TIMEOUT_S``; any failure (not
vLLM, an old vLLM without the route, a timeout) leaves the transcript's counts alone.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from gateway.backend import Backend
from gateway.connection import UpstreamError
from gateway.migration import Plan, one_prompt
from gateway.sse import Transcript
from gateway.upstream import UpstreamPool

TIMEOUT_S = 1.0
_MAX_BODY = 1 << 20  # the answer is a count and a token list; refuse anything far larger
# What a chat completion renders its prompt with, besides the messages (vLLM's TokenizeChatRequest).
_CHAT_OPTIONS = ("add_generation_prompt", "continue_final_message", "add_special_tokens", "chat_template",
                 "chat_template_kwargs", "tools", "mm_processor_kwargs")


async def recount(upstream: UpstreamPool, backend: Backend, upstream_key: bytes | None, deadline: float,
                  model: str, t: Transcript, plan: Plan) -> None:
    """Raise ``t.tokens`` to ``backend``'s count of the relayed text where that is larger, and set
    ``t.prompt_tokens`` to its count of the original prompt where no usage gave it; both asked at once."""
    async def nothing() -> None:
        return None

    text, prompt = await asyncio.gather(
        _count(upstream, backend, {"model": model, "prompt": t.text, "add_special_tokens": False}, upstream_key,
               deadline) if t.text else nothing(),
        _count(upstream, backend, _prompt_request(model, plan), upstream_key, deadline)
        if t.prompt_tokens is None else nothing())
    if text is not None and text > t.tokens:
        t.tokens = text
    if prompt is not None:
        t.prompt_tokens = prompt


def _prompt_request(model: str, plan: Plan) -> dict[str, Any]:
    """/tokenize of the original request's prompt, rendered as its completion would render it."""
    doc = plan.doc
    if plan.chat:
        return {"model": model, "messages": doc["messages"], **{k: doc[k] for k in _CHAT_OPTIONS if k in doc}}
    out = {"model": model, "prompt": one_prompt(doc["prompt"])}  # a string: migration._refusal saw to it
    return out | ({"add_special_tokens": doc["add_special_tokens"]} if "add_special_tokens" in doc else {})


async def _count(upstream: UpstreamPool, backend: Backend, ask: dict[str, Any],
                 upstream_key: bytes | None, deadline: float) -> int | None:
    """The token count ``backend``'s /tokenize gives ``ask``, or None."""
    body = json.dumps(ask).encode()
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
