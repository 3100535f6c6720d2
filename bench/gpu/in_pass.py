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
any workers), read from /proc: whether one side's vLLM got less CPU or stepped slower. Beside
each CPU figure, the seconds its threads spent ready to run but waiting for a CPU (the run delay
in /proc/PID/task/*/schedstat): whether another process took the CPU its engine core needed. And,
where each instance's GPU is given, that GPU's busy share, SM clock and power as NVML reports
them: whether an engine that steps slower waits on its GPU or on its CPU.
"""

from __future__ import annotations

import importlib
import re
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from bench_clients import cpu_seconds  # beside this file: the twin scripts run from here

_RUNNING = re.compile(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", re.M)
_WAITING = re.compile(r"^vllm:num_requests_waiting\{[^}]*\} (\S+)$", re.M)
GAUGES = ("running", "waiting", "conns_open", "conns_idle")
# vLLM's histograms whose sum and count each sample keeps, in this order after the gauges
CLOCKS = {"vllm_ttft": "vllm:time_to_first_token_seconds", "vllm_queue": "vllm:request_queue_time_seconds",
          "vllm_e2e": "vllm:e2e_request_latency_seconds", "vllm_itl": "vllm:inter_token_latency_seconds"}
STEPS = "vllm:iteration_tokens_total"  # then its sum and count, then the process and GPU figures (engine())
# after the steps' sum and count: the CPU seconds and the run delay of the API server and of its
# descendants, then its GPU's busy %, SM clock (MHz) and power (W); -1 where not known
PROCESS = ("api_cpu", "engine_cpu", "api_wait", "engine_wait")
GPU = ("gpu_busy_pct", "sm_mhz", "power_w")


def _sum_count(name: str) -> list[re.Pattern[str]]:
    return [re.compile(rf"^{re.escape(name)}_{part}\{{[^}}]*\}} (\S+)$", re.M) for part in ("sum", "count")]


_SUMS = {k: _sum_count(n) for k, n in CLOCKS.items()}
_STEPS = _sum_count(STEPS)
_CLOCK_AT = 1 + len(GAUGES)  # a sample's first clock column
_STEPS_AT = _CLOCK_AT + 2 * len(CLOCKS)
_GPU_AT = _STEPS_AT + 2 + len(PROCESS)


def gauge(pattern: re.Pattern[str], text: str) -> float:
    """The sum of ``pattern``'s values in a /metrics text (over its label sets)."""
    return sum(float(v) for v in pattern.findall(text))


def clocks(text: str) -> list[float]:
    """``CLOCKS``' sums and counts so far in a vLLM's /metrics, in order: sum, count, sum, ..., then
    ``STEPS``' sum and count."""
    return [gauge(p, text) for pair in (*_SUMS.values(), _STEPS) for p in pair]


def _cpu_s(pid: int) -> float:
    return cpu_seconds(pid) or 0.0  # 0 once it is gone


def descendants(pid: int) -> list[int]:
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


def _run_delay(pid: int) -> float:
    """Seconds the live threads of ``pid`` have waited for a CPU while ready to run (0 once gone)."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


def processes(pid: int | None) -> list[float]:
    """``PROCESS``' figures so far: the CPU seconds of ``pid`` (an instance's API server) and of all
    its descendants, then the run delay of each (``_run_delay``); -1 for all without a PID."""
    if pid is None:
        return [-1.0] * len(PROCESS)
    below = descendants(pid)  # walked once for both figures
    return [_cpu_s(pid), sum(_cpu_s(c) for c in below), _run_delay(pid), sum(_run_delay(c) for c in below)]


class Gpus:
    """NVML's view of GPUs by index, or -1s where NVML is not there (a machine without GPUs)."""

    def __init__(self) -> None:
        self.nvml: Any = None
        try:
            try:
                nvml = importlib.import_module("pynvml")  # nvidia-ml-py
            except ImportError:
                # the copy vLLM carries; only then, as importing vllm takes seconds of the pass
                nvml = importlib.import_module("vllm.third_party.pynvml")
            nvml.nvmlInit()
        except Exception:  # no library, no driver (no GPU here): the figures are unknown
            return
        self.nvml = nvml

    def figures(self, index: int | None) -> list[float]:
        """``GPU``'s figures for GPU ``index`` now."""
        if self.nvml is None or index is None:
            return [-1.0] * len(GPU)
        n = self.nvml
        try:
            h = n.nvmlDeviceGetHandleByIndex(index)
            return [float(n.nvmlDeviceGetUtilizationRates(h).gpu), float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
                    n.nvmlDeviceGetPowerUsage(h) / 1000]
        except n.NVMLError:
            return [-1.0] * len(GPU)


class Sampler(threading.Thread):
    """Samples ``instances`` (name -> base URL) and the gateway at ``gateway`` every ``every`` s,
    each row ``[s since t0, running, waiting, gateway connections open, idle]``, then each of
    ``CLOCKS``' sum and count so far, ``STEPS``' sum and count, ``PROCESS``' figures of the
    instance's API server and its descendants (``pids``: name -> the API server's PID) and ``GPU``'s
    of its GPU (``gpus``: name -> NVML index), until ``stop()``."""

    def __init__(self, instances: dict[str, str], gateway: str, t0: float, every: float = 1.0,
                 pids: dict[str, int] | None = None, gpus: dict[str, int] | None = None) -> None:
        super().__init__(daemon=True)
        self.instances, self.gateway, self.t0, self.every = instances, gateway, t0, every
        self.pids, self.gpus = pids or {}, gpus or {}
        self.rows: dict[str, list[list[float]]] = {name: [] for name in instances}
        self._halt = threading.Event()

    def run(self) -> None:
        gpus = Gpus()
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
                                            *clocks(text), *processes(self.pids.get(name)),
                                            *gpus.figures(self.gpus.get(name))])

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
    and tokens a step (``STEPS``); ``PROCESS``' figures as shares of a CPU (None without PIDs or in
    samples from before the run delay was kept); and ``GPU``'s means over the samples (None
    without them). None without two samples that carry the steps and the CPU."""
    inside = [r for r in in_window(rows, start, end) if len(r) >= _STEPS_AT + 4]
    if len(inside) < 2:
        return None
    first, last = inside[0], inside[-1]
    span = last[0] - first[0]
    steps = last[_STEPS_AT + 1] - first[_STEPS_AT + 1]
    out: dict[str, float | None] = {
        "steps_per_s": round(steps / span, 1) if span > 0 else None,
        "tokens_per_step": round((last[_STEPS_AT] - first[_STEPS_AT]) / steps, 1) if steps > 0 else None}
    for k, key in enumerate(PROCESS, start=_STEPS_AT + 2):
        known = len(last) > k and first[k] >= 0 and span > 0
        out[key] = round((last[k] - first[k]) / span, 3) if known else None
    if len(last) >= _GPU_AT + len(GPU):
        for k, key in enumerate(GPU, start=_GPU_AT):
            values = [r[k] for r in inside if len(r) > k and r[k] >= 0]
            out[key] = round(statistics.fmean(values), 1) if values else None
    return out
