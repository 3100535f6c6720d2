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
Its mean gap between a request's tokens (``vllm:inter_token_latency_seconds``) is kept the same way.

And how the engine and vLLM's processes went (``engine``): ``vllm:iteration_tokens_total`` is
observed once per engine step with the tokens it computed, so its count over a window is the
engine's steps and its sum ÷ count the tokens a step; and, where the instances' PIDs are given,
the CPU seconds of each instance's API server process and of its descendants (the engine core,
any workers), read from /proc: whether one side's vLLM got less CPU or stepped slower.
"""

from __future__ import annotations

import re
import statistics
import threading
import time
from pathlib import Path

import httpx
from bench_clients import cpu_seconds  # beside this file: the twin scripts run from here

_RUNNING = re.compile(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", re.M)
_WAITING = re.compile(r"^vllm:num_requests_waiting\{[^}]*\} (\S+)$", re.M)
GAUGES = ("running", "waiting", "conns_open", "conns_idle")
# vLLM's histograms whose sum and count each sample keeps, in this order after the gauges
CLOCKS = {"vllm_ttft": "vllm:time_to_first_token_seconds", "vllm_queue": "vllm:request_queue_time_seconds",
          "vllm_e2e": "vllm:e2e_request_latency_seconds", "vllm_itl": "vllm:inter_token_latency_seconds"}
STEPS = "vllm:iteration_tokens_total"  # then its sum and count, then the two CPU figures (engine())


def _sum_count(name: str) -> list[re.Pattern[str]]:
    return [re.compile(rf"^{re.escape(name)}_{part}\{{[^}}]*\}} (\S+)$", re.M) for part in ("sum", "count")]


_SUMS = {k: _sum_count(n) for k, n in CLOCKS.items()}
_STEPS = _sum_count(STEPS)
_CLOCK_AT = 1 + len(GAUGES)  # a sample's first clock column
_STEPS_AT = _CLOCK_AT + 2 * len(CLOCKS)


def gauge(pattern: re.Pattern[str], text: str) -> float:
    """The sum of ``pattern``'s values in a /metrics text (over its label sets)."""
    return sum(float(v) for v in pattern.findall(text))


def clocks(text: str) -> list[float]:
    """``CLOCKS``' sums and counts so far in a vLLM's /metrics, in order: sum, count, sum, ..., then
    ``STEPS``' sum and count."""
    return [gauge(p, text) for pair in (*_SUMS.values(), _STEPS) for p in pair]


def _cpu_s(pid: int) -> float:
    return cpu_seconds(pid) or 0.0  # 0 once it is gone


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                kids = [int(c) for c in task.read_text().split()]
            except (OSError, ValueError):
                continue
            out += kids
            todo += kids
    return out


def process_cpu(pid: int | None) -> list[float]:
    """CPU seconds so far of ``pid`` (an instance's API server) and of all its descendants; -1 for
    both without a PID."""
    if pid is None:
        return [-1.0, -1.0]
    return [_cpu_s(pid), sum(_cpu_s(c) for c in _descendants(pid))]


class Sampler(threading.Thread):
    """Samples ``instances`` (name -> base URL) and the gateway at ``gateway`` every ``every`` s,
    each row ``[s since t0, running, waiting, gateway connections open, idle]``, then each of
    ``CLOCKS``' sum and count so far, ``STEPS``' sum and count, and the CPU seconds of the
    instance's API server and its descendants (``pids``: name -> the API server's PID), until
    ``stop()``."""

    def __init__(self, instances: dict[str, str], gateway: str, t0: float, every: float = 1.0,
                 pids: dict[str, int] | None = None) -> None:
        super().__init__(daemon=True)
        self.instances, self.gateway, self.t0, self.every = instances, gateway, t0, every
        self.pids = pids or {}
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
                                            *clocks(text), *process_cpu(self.pids.get(name))])

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
    inside = [r for r in in_window(rows, start, end) if len(r) > _CLOCK_AT]
    if len(inside) < 2:
        return None
    first, last = inside[0], inside[-1]
    out: dict[str, float | None] = {}
    counts: dict[str, float] = {}
    for i, key in enumerate(CLOCKS):
        at = _CLOCK_AT + 2 * i
        if len(last) <= at + 1:
            continue  # samples from before this clock was kept
        total, counts[key] = last[at] - first[at], last[at + 1] - first[at + 1]
        out[f"{key}_ms"] = round(total / counts[key] * 1000, 1) if counts[key] > 0 else None
    out["first_tokens"] = counts["vllm_ttft"]
    return out


def engine(rows: list[list[float]], start: float, end: float) -> dict[str, float | None] | None:
    """Between the first and the last sample in [start, end) s since t0: the engine's steps a second
    and tokens a step (``STEPS``), and the share of a CPU the API server and its descendants used
    (None without PIDs); None without two samples that carry them."""
    inside = [r for r in in_window(rows, start, end) if len(r) >= _STEPS_AT + 4]
    if len(inside) < 2:
        return None
    first, last = inside[0], inside[-1]
    span = last[0] - first[0]
    steps = last[_STEPS_AT + 1] - first[_STEPS_AT + 1]
    api, below = (last[_STEPS_AT + k] - first[_STEPS_AT + k] for k in (2, 3))
    placed = first[_STEPS_AT + 2] >= 0
    return {"steps_per_s": round(steps / span, 1) if span > 0 else None,
            "tokens_per_step": round((last[_STEPS_AT] - first[_STEPS_AT]) / steps, 1) if steps > 0 else None,
            "api_cpu": round(api / span, 3) if placed and span > 0 else None,
            "engine_cpu": round(below / span, 3) if placed and span > 0 else None}
