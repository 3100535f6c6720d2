"""The OpenAI error envelope, as raw ASGI responses (the proxy path) and as bytes.

Every failure the gateway itself produces goes through ``error_body`` so that clients see one
shape: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Send

INVALID_REQUEST = "invalid_request_error"
UNAVAILABLE = "service_unavailable"
UPSTREAM = "upstream_error"
RATE_LIMIT = "requests"  # what OpenAI sends with 429 rate_limit_exceeded for request-count limits
INTERNAL = "internal_error"


def error_body(message: str, type_: str, code: str | int | None, param: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}}).encode()


async def send_error(
    send: Send,
    status: int,
    message: str,
    type_: str,
    code: str | int | None,
    param: str | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    body = error_body(message, type_, code, param)
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                    *(headers or [])],
    })
    await send({"type": "http.response.body", "body": body})


def sse_error_event(message: str, code: int = 502) -> bytes:
    """What a stream ends with when its upstream fails after the first byte (DESIGN §2)."""
    payload: dict[str, Any] = {"error": {"message": message, "type": UPSTREAM, "param": None, "code": code}}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"
