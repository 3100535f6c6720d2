"""Where a twin pass's requests are, sampled once a second while it runs (twin_pairs.py).

Each instance's vLLM reports how many requests it runs and how many wait in its scheduler
(``vllm:num_requests_running`` / ``_waiting``); the gateway's ``/fleet`` how many connections it
holds to each backend, open and idle. A closed loop keeps ``conc`` requests in flight on each side;
if the gateway's side shows the same tokens/s with a longer TTFT and shorter gaps between tokens,
fewer of its requests decode at once, and these samples say whether the rest wait in vLLM's
scheduler or before it (in the gateway, on a connection, in vLLM's HTTP server).
"""

from __future__ import annotations

import re
import statistics
import threading
import time

import httpx

_RUNNING = re.compile(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", re.M)
_WAITING = re.compile(r"^vllm:num_requests_waiting\{[^}]*\} (\S+)$", re.M)


def _gauge(pattern: re.Pattern[str], text: str) -> float:
    return sum(float(v) for v in pattern.findall(text))


class Sampler(threading.Thread):
    """Samples ``instances`` (name -> base URL) and the gateway at ``gateway`` every ``every`` s,
    each row ``[s since t0, running, waiting, gateway connections open, idle]``, until ``stop()``."""

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
                    self.rows[name].append([t, _gauge(_RUNNING, text), _gauge(_WAITING, text),
                                            c.get("open", 0), c.get("idle", 0)])

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
    cols = zip(*(r[1:] for r in inside), strict=True)
    return dict(zip(("running", "waiting", "conns_open", "conns_idle"),
                    (round(statistics.fmean(c), 1) for c in cols), strict=True))
