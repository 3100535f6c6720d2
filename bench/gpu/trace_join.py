"""Where each request's time to first token went: the client's stamps (``vllm bench serve
--save-detailed``: start, TTFT, time queued in the client) joined by request id with a traced
gateway's (``gateway_trace.py``), all on CLOCK_MONOTONIC of one host.

Phases of one request, in ms:

- ``to_gateway``: the client's send began → the gateway's loop read the request (a wave of
  requests read one after another shows here; so does a connection the client opened for it);
- ``read_to_app``: read → the ASGI app ran (uvicorn's task waiting for its turn in the loop);
- ``in_gateway``: app → the first body chunk sent to the client (routing, the upstream request,
  vLLM's own time to first token, the relay of that chunk);
- ``back_to_client``: the first chunk sent → the client counted its first token (the write, the
  client's loop reading it among every other stream's chunks).

With a traced vLLM too (``serve_pairs.py start --trace-vllm``), ``in_gateway`` splits into
``to_vllm`` (app → vLLM's loop read the gateway's request) and ``in_vllm`` (that read → the first
chunk sent to the client), and ``to_vllm`` again into ``app_to_send`` (routing, limits: until the
request goes to the upstream pool) and ``send_to_vllm`` (a connection taken or opened, written,
read by vLLM), with ``to_vllm`` apart for requests that opened a new upstream connection. Such a
request's ``send_to_vllm`` splits once more: ``connecting`` (the gateway's connect until its loop
saw the connection up), ``to_accept`` (→ vLLM's server accepted it) and ``accept_to_read``
(→ vLLM's loop read the request, which the gateway wrote at once). A direct pass gets
``to_server`` and ``in_server`` (``arrivals``), and ``accept_to_read`` for a connection's first
request.

For each phase: its median, p90, p99 over the pass, and its mean over the requests with the slowest
1 % of client TTFTs (where the tail is spent); ``to_gateway`` also apart for a connection's first
request (the client connected for it) and for requests on a reused connection.
"""

from __future__ import annotations

import statistics
from typing import Any

PHASES = ("to_gateway", "read_to_app", "in_gateway", "back_to_client")


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _summary(xs: list[float], slowest: list[float]) -> dict[str, float]:
    """One phase over a pass: ``xs`` every request's, ``slowest`` those of the slowest 1 %."""
    out = {"p50": round(_q(xs, 0.5), 1), "p90": round(_q(xs, 0.9), 1), "p99": round(_q(xs, 0.99), 1),
           "mean": round(statistics.fmean(xs), 1)}
    if slowest:
        out["mean_slowest_1pct"] = round(statistics.fmean(slowest), 1)
    return out


def _mean(xs: list[float]) -> dict[str, Any]:
    return {"n": len(xs), "mean": round(statistics.fmean(xs), 1) if xs else None}


def join(ids: list[str], starts: list[float], ttfts: list[float], records: list[dict[str, Any]],
         vllm_lines: list[str] | None = None) -> dict[str, Any]:
    """``ids``/``starts``/``ttfts``: the clients', request by request; ``records``: the gateway's
    trace of the same pass; ``vllm_lines``: a traced vLLM's (the gateway passes x-request-id on), which
    split ``in_gateway`` into ``to_vllm`` (app → vLLM read it) and ``in_vllm`` (→ first chunk sent)."""
    by_id = {r.get("id"): r for r in records}
    reads = _reads(vllm_lines or [])
    rows: list[dict[str, Any]] = []
    for rid, start, ttft in zip(ids, starts, ttfts, strict=False):
        r = by_id.get(rid)
        if r is None or not ttft or "first" not in r or r.get("read") is None:
            continue
        rows.append({"new_conn": r.get("conn") is not None, "ttft": ttft * 1000,
                     "to_gateway": (r["read"] - start) * 1000, "read_to_app": (r["app"] - r["read"]) * 1000,
                     "in_gateway": (r["first"] - r["app"]) * 1000,
                     "back_to_client": (start + ttft - r["first"]) * 1000})
        if "sent" in r:
            rows[-1]["app_to_send"] = (r["sent"] - r["app"]) * 1000
            rows[-1]["connected"] = "connect" in r
        if rid in reads:
            rows[-1]["to_vllm"] = (reads[rid][0] - r["app"]) * 1000
            rows[-1]["in_vllm"] = (r["first"] - reads[rid][0]) * 1000
            if "sent" in r:
                rows[-1]["send_to_vllm"] = (reads[rid][0] - r["sent"]) * 1000
            accepted = reads[rid][1]
            if "connected" in r and accepted is not None:
                rows[-1]["connecting"] = (r["connected"] - r["connect"]) * 1000
                rows[-1]["to_accept"] = (accepted - r["connected"]) * 1000
                rows[-1]["accept_to_read"] = (reads[rid][0] - accepted) * 1000
    if not rows:
        return {"joined": 0, "traced": len(records), "client": len(starts)}
    slow = sorted(rows, key=lambda x: x["ttft"])[-max(1, len(rows) // 100):]
    out: dict[str, Any] = {"joined": len(rows), "traced": len(records), "client": len(starts)}
    for k in ("ttft", *PHASES, "to_vllm", "in_vllm", "app_to_send", "send_to_vllm", "connecting", "to_accept",
              "accept_to_read"):
        xs = [x[k] for x in rows if k in x]
        if not xs:
            continue
        out[k] = _summary(xs, [x.get(k, 0.0) for x in slow])
    for new in (True, False):
        out["to_gateway_" + ("new_connection" if new else "reused_connection")] = _mean(
            [x["to_gateway"] for x in rows if x["new_conn"] is new])
        out["to_vllm_" + ("new_upstream_connection" if new else "pooled_upstream_connection")] = _mean(
            [x["to_vllm"] for x in rows if x.get("connected") is new and "to_vllm" in x])
    return out


def _reads(lines: list[str]) -> dict[str, tuple[float, float | None]]:
    """A traced vLLM's lines (``vllm_trace/``: ``id read conn``): id → (read, when its connection was
    accepted, for a connection's first request; else None)."""
    read: dict[str, tuple[float, float | None]] = {}
    for line in lines:
        f = line.split()
        if len(f) == 3:
            read[f[0]] = (float(f[1]), None if f[2] == "-" else float(f[2]))
    return read


def arrivals(ids: list[str], starts: list[float], ttfts: list[float], lines: list[str]) -> dict[str, Any]:
    """The direct target through a traced vLLM: the client's send → the server's loop read the
    request (``to_server``, as ``to_gateway`` above), and read → the client's first token
    (``in_server``)."""
    read = _reads(lines)
    rows = [((read[i][0] - s) * 1000, read[i][1] is not None, (s + t - read[i][0]) * 1000)
            for i, s, t in zip(ids, starts, ttfts, strict=False) if i in read and t]
    accept_to_read = [(r - a) * 1000 for r, a in (read[i] for i in ids if i in read) if a is not None]
    if not rows:
        return {"joined": 0}
    slow = sorted(rows, key=lambda x: x[0] + x[2])[-max(1, len(rows) // 100):]
    out: dict[str, Any] = {"joined": len(rows)}
    for name, col in (("to_server", 0), ("in_server", 2)):
        out[name] = _summary([float(x[col]) for x in rows], [float(x[col]) for x in slow])
    for new in (True, False):
        out["to_server_" + ("new_connection" if new else "reused_connection")] = _mean(
            [x for x, n, _ in rows if n is new])
    if accept_to_read:
        out["accept_to_read"] = _summary(accept_to_read, [])
    return out
