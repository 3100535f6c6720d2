"""Where a twin pass's requests are, sampled once a second while it runs (twin_pairs.py).

Each instance's vLLM reports how many requests it runs and how many wait in its scheduler
(``vllm:num_requests_running`` / ``_waiting``); the gateway's ``/fleet`` how many connections it
holds to each backend, open and idle. A closed loop keeps ``conc`` requests in flight on each side;
if the gateway's side shows the same tokens/s with a longer TTFT and shorter gaps between tokens,
fewer of its requests decode at once, and these samples say whether the rest wait in vLLM's
scheduler or before it (in the gateway, on a connection, in vLLM's HTTP server).

Each sample also keeps the sums and counts of three of vLLM's own histograms, so that a window's
means by vLLM's clocks can be set beside the client's (``vllm_means``): time to first token, time
waiting in the scheduler's queue, and the request's whole life. vLLM 0.24.0 starts that clock when
its completion handler begins to render the prompt (``arrival_time`` in vllm/renderers/base.py,
before tokenizing), after its HTTP server parsed and validated the request; TTFT ends when its
output processor handles the first token. What the client measures beyond vLLM's TTFT is spent in
the gateway, on the sockets and in vLLM's HTTP server, before the handler or after the output.
"""

from __future__ import annotations

import re
import statistics
import threading
import time

import httpx

_RUNNING = re.compile(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", re.M)
_WAITING = re.compile(r"^vllm:num_requests_waiting\{[^}]*\} (\S+)$", re.M)
GAUGES = ("running", "waiting", "conns_open", "conns_idle")
# vLLM's histograms whose sum and count each sample keeps, in this order after the gauges
CLOCKS = {"vllm_ttft": "vllm:time_to_first_token_seconds", "vllm_queue": "vllm:request_queue_time_seconds",
          "vllm_e2e": "vllm:e2e_request_latency_seconds"}
_SUMS = {k: [re.compile(rf"^{re.escape(n)}_{part}\{{[^}}]*\}} (\S+)$", re.M) for part in ("sum", "count")]
         for k, n in CLOCKS.items()}


def gauge(pattern: re.Pattern[str], text: str) -> float:
    """The sum of ``pattern``'s values in a /metrics text (over its label sets)."""
    return sum(float(v) for v in pattern.findall(text))


def clocks(text: str) -> list[float]:
    """``CLOCKS``' sums and counts so far in a vLLM's /metrics, in order: sum, count, sum, ..."""
    return [gauge(p, text) for pair in _SUMS.values() for p in pair]


class Sampler(threading.Thread):
    """Samples ``instances`` (name -> base URL) and the gateway at ``gateway`` every ``every`` s,
    each row ``[s since t0, running, waiting, gateway connections open, idle]`` and then each of
    ``CLOCKS``' sum and count so far, until ``stop()``."""

    def __init__(self, instances: dict[str, str], gateway: str, t0: float, every: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.instances, self.gateway, self.t0, self.every = instances, gateway, t0, every
        self.rows: dict[str, list[list[float]]] = {name: [] for name in instances}
        self._halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=2.0) as http:
            while not self._halt.wait(max(0.0, self.every - (time.monotonic() - self.t0) % self.every)):
                t = round(time.monotonic() - self.t0, 2)
                try:
                    backends = http.get(self.gateway + "/fleet").json()["backends"]
                    conns = {b["name"]: b.get("connections", {}) for b in backends}
                except (httpx.HTTPError, ValueError, KeyError):
                    conns = {}
                for name, base in self.instances.items():
                    try:
                        text = http.get(base + "/metrics").text
                    except httpx.HTTPError:
                        continue
                    c = conns.get(name, {})
                    self.rows[name].append([t, gauge(_RUNNING, text), gauge(_WAITING, text),
                                            c.get("open", 0), c.get("idle", 0),
                                            *clocks(text)])

    def stop(self) -> dict[str, list[list[float]]]:
        self._halt.set()
        self.join(timeout=10)
        return self.rows


def instance(path: str) -> str:
    """The instance a side's path reaches: ``direct:a`` and ``gateway:a`` both reach ``a``."""
    return path.rsplit(":", 1)[1]


def in_window(rows: list[list[float]], start: float, end: float) -> list[list[float]]:
    """The samples taken in [start, end) s since t0."""
    return [r for r in rows if start <= r[0] < end]


def means(rows: list[list[float]], start: float, end: float) -> dict[str, float] | None:
    """The samples' means over [start, end) s since t0: running, waiting, connections open, idle."""
    inside = in_window(rows, start, end)
    if not inside:
        return None
    cols = zip(*(r[1:1 + len(GAUGES)] for r in inside), strict=True)
    return dict(zip(GAUGES, (round(statistics.fmean(c), 1) for c in cols), strict=True))


def vllm_means(rows: list[list[float]], start: float, end: float) -> dict[str, float | None] | None:
    """Each of ``CLOCKS``' mean in ms over the requests vLLM observed between the first and the last
    sample in [start, end) s since t0 (its sums' and counts' differences), and how many requests
    had their first token in that span; None without two samples that carry the sums."""
    inside = [r for r in in_window(rows, start, end) if len(r) > 1 + len(GAUGES)]
    if len(inside) < 2:
        return None
    first, last = inside[0], inside[-1]
    out: dict[str, float | None] = {}
    counts: dict[str, float] = {}
    for i, key in enumerate(CLOCKS):
        at = 1 + len(GAUGES) + 2 * i
        total, counts[key] = last[at] - first[at], last[at + 1] - first[at + 1]
        out[f"{key}_ms"] = round(total / counts[key] * 1000, 1) if counts[key] > 0 else None
    out["first_tokens"] = counts["vllm_ttft"]
    return out
