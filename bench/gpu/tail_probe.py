"""Where a slow first token is spent (issue 21's TTFT p99 gap): snapshots taken before and after
one ``vllm bench serve`` pass, and what moved between them.

- vLLM's own histograms: time to first token as the engine counts it (from the request's arrival in
  the engine), time waiting in its scheduler queue, prefill time;
- the gateway's time to first byte (request in → first response body byte, ``/metrics``);
- the kernel's TCP counters (``/proc/net/netstat``, ``/proc/net/snmp``): listen-queue overflows
  and drops (a dropped SYN is retried after 1 s, then 3 s, 7 s ...), retransmissions, timeouts.

Quantiles from histogram deltas are bucket upper bounds (what Prometheus' histogram_quantile does,
without interpolation): coarse, but enough to tell 1 s from 3 s.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx

HISTOGRAMS = {
    "vllm_ttft": "vllm:time_to_first_token_seconds",
    "vllm_queue": "vllm:request_queue_time_seconds",
    "vllm_prefill": "vllm:request_prefill_time_seconds",
    "gw_ttfb": "fleet_time_to_first_byte_seconds",
}
TCP = ("ListenOverflows", "ListenDrops", "TCPTimeouts", "TCPSynRetrans", "RetransSegs", "TCPAbortOnData",
       "TCPBacklogDrop", "TCPReqQFullDrop", "TCPReqQFullDoCookies")
_BUCKET = re.compile(r'^(\S+)_bucket\{(.*?)\} (\S+)$', re.M)


def _buckets(text: str, name: str) -> dict[float, float]:
    out: dict[float, float] = {}
    for m in _BUCKET.finditer(text):
        if m.group(1) != name:
            continue
        le = re.search(r'le="([^"]+)"', m.group(2))
        if le:
            k = float("inf") if le.group(1) == "+Inf" else float(le.group(1))
            out[k] = out.get(k, 0.0) + float(m.group(3))
    return out


def _tcp() -> dict[str, float]:
    out: dict[str, float] = {}
    for f in ("/proc/net/netstat", "/proc/net/snmp"):
        lines = Path(f).read_text().splitlines()
        for head, vals in zip(lines[::2], lines[1::2], strict=False):
            for k, v in zip(head.split()[1:], vals.split()[1:], strict=False):
                if k in TCP:
                    out[k] = float(v)
    return out


def snapshot(vllm_url: str, gw_url: str) -> dict[str, Any]:
    vllm = httpx.get(vllm_url + "/metrics", timeout=10).text
    gw = httpx.get(gw_url + "/metrics", timeout=10).text
    snap: dict[str, Any] = {k: _buckets(gw if k.startswith("gw") else vllm, n) for k, n in HISTOGRAMS.items()}
    snap["tcp"] = _tcp()
    return snap


def _quantiles(before: dict[float, float], after: dict[float, float]) -> dict[str, Any]:
    delta = sorted((le, after.get(le, 0.0) - before.get(le, 0.0)) for le in after)
    total = delta[-1][1] if delta else 0.0
    if not total:
        return {"n": 0}
    res: dict[str, Any] = {"n": int(total)}
    for q in (0.5, 0.9, 0.99):
        res[f"p{int(q * 100)}_le"] = next(le for le, c in delta if c >= q * total)
    return res


def moved(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    res: dict[str, Any] = {k: _quantiles(before[k], after[k]) for k in HISTOGRAMS}
    res["tcp"] = {k: after["tcp"].get(k, 0) - before["tcp"].get(k, 0) for k in TCP if k in after["tcp"]}
    return res


def ttft_shape(ttfts_s: list[float]) -> dict[str, Any]:
    """The slowest first tokens of one pass, and how many fell in each half second."""
    xs = sorted(ttfts_s)
    hist: dict[str, int] = {}
    for x in xs:
        k = f"{int(x * 2) / 2:.1f}"
        hist[k] = hist.get(k, 0) + 1
    return {"slowest": [round(x, 3) for x in xs[-12:]], "per_half_s": hist}


class SocketSampler:
    """Every ``interval`` s during a pass, from ``ss``: the accept queue of each listening port, and
    how many of its accepted connections hold unread bytes (a request written to it that its server
    has not read yet) and the most bytes any one holds. A server whose loop is late reading new
    requests shows here; one that reads them at once and is slow afterwards does not."""

    def __init__(self, ports: tuple[int, ...], interval: float = 0.1) -> None:
        self.ports = ports
        self.interval = interval
        self.rows: list[dict[str, Any]] = []
        self.missing = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> SocketSampler:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                out = subprocess.run(["ss", "-tanH"], capture_output=True, text=True).stdout
            except FileNotFoundError:
                self.missing = True  # no `ss` on this host: nothing measured, and summary() says so
                return
            row: dict[str, Any] = {"t": round(time.monotonic() - self._t0, 2)}
            for port in self.ports:
                acceptq, unread, most, conns = 0, 0, 0, 0
                for line in out.splitlines():
                    f = line.split()
                    if len(f) < 5 or not f[3].endswith(f":{port}"):
                        continue
                    if f[0] == "LISTEN":
                        acceptq = int(f[1])
                    elif f[0] == "ESTAB":
                        conns += 1
                        if int(f[1]) > 0:
                            unread += 1
                            most = max(most, int(f[1]))
                row[str(port)] = [acceptq, conns, unread, most]
            self.rows.append(row)

    def summary(self) -> dict[str, Any]:
        """Per port: the largest accept queue, most connections with unread requests at once, and
        the samples (t, [accept queue, connections, with unread bytes, most bytes]) where any was."""
        if self.missing:
            return {"error": "ss not found: no socket samples"}
        res: dict[str, Any] = {}
        for port in map(str, self.ports):
            vals = [(r["t"], r[port]) for r in self.rows if port in r]
            res[port] = {"max_accept_queue": max((v[0] for _, v in vals), default=0),
                         "max_unread_conns": max((v[2] for _, v in vals), default=0),
                         "busy": [(t, v) for t, v in vals if v[0] or v[2]][:60]}
        return res
