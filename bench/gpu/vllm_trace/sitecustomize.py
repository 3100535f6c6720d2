"""When the time a vLLM API server read each request, for comparing with the gateway's
(``gateway_trace.py``): put this folder first on the PYTHONPATH of the vLLM process and set
FLEET_TRACE_FILE (``serve_pairs.py start --trace-vllm`` does both). Bench only.

It patches uvicorn's httptools protocol, which vLLM's server runs on, to append a line per request:
``x-request-id  read  conn`` (``time.perf_counter()`` when the loop read the request's first bytes,
and when its connection was accepted, or ``-`` for a request on a reused connection).
"""

from __future__ import annotations

import os
import time
from typing import Any


def stamp_reads(proto: Any) -> None:
    """Patch uvicorn's httptools protocol class ``proto`` (or a subclass) to note when each
    connection was accepted (``_trace_conn``) and when the loop read a request's first bytes
    (``_trace_read``); gateway_trace.py uses it too."""
    made, begin = proto.connection_made, proto.on_message_begin

    def connection_made(self: Any, transport: Any) -> None:
        self._trace_conn = time.perf_counter()
        made(self, transport)

    def on_message_begin(self: Any) -> None:
        self._trace_read = time.perf_counter()
        begin(self)

    proto.connection_made = connection_made
    proto.on_message_begin = on_message_begin


def _install(path: str) -> None:
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as P
    except ImportError:
        return
    out = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    stamp_reads(P)
    done = P.on_headers_complete

    def on_headers_complete(self: Any) -> None:
        done(self)
        rid = next((v.decode() for k, v in self.headers if k == b"x-request-id"), None)
        if rid:
            conn = getattr(self, "_trace_conn", None)
            out.write(f"{rid} {self._trace_read:.6f} {'-' if conn is None else f'{conn:.6f}'}\n")
        self._trace_conn = None  # only a connection's first request waited for the accept

    P.on_headers_complete = on_headers_complete  # type: ignore[method-assign]


if os.environ.get("FLEET_TRACE_FILE"):
    _install(os.environ["FLEET_TRACE_FILE"])
