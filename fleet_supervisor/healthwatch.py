"""Is the child alive: ``GET /health`` = 200, polled while it starts and while it runs.

"Alive" means it answers: a process that exists but does not answer is restarted like one that
exited, since vLLM's /health turns 503 when its engine dies while /v1/models keeps answering.
Every wait races the process exiting and a stop (watch.py); the reason a run ended is returned
for the instance's ``last_exit``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import aiohttp

from fleet_supervisor.watch import Outcome, Watch
from fleetspec.fleetfile import SupervisorSection


class HealthWatch:
    def __init__(self, url: str, cfg: SupervisorSection, session: aiohttp.ClientSession) -> None:
        self.url = url
        self._cfg = cfg
        self._session = session

    async def until_healthy(self, watch: Watch, poll_s: float) -> tuple[Outcome, str | None]:
        """Until the first 200 (HEALTHY), or startup_timeout_s passes (UNHEALTHY), or the run ends."""
        cfg = self._cfg
        deadline = time.monotonic() + cfg.startup_timeout_s
        poll = min(cfg.health_interval_s, poll_s)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return Outcome.UNHEALTHY, f"no 200 from {self.url} within startup_timeout_s={cfg.startup_timeout_s:g}"
            outcome = await watch.probe(self.probe(min(cfg.health_timeout_s, remaining)))
            if outcome is not Outcome.UNHEALTHY:
                return outcome, None
            event = await watch.pause(min(poll, deadline - time.monotonic()))
            if event is not None:
                return event, None

    async def monitor(self, watch: Watch, takes: Callable[[], bool]) -> tuple[Outcome, str | None]:
        """Probe every health_interval_s until the process ends, health_failures probes in a row fail,
        a stop comes, or a command that ``takes()`` accepts is pending."""
        cfg = self._cfg
        failed = 0
        while True:
            event = await watch.pause(cfg.health_interval_s, takes)
            if event is not None:
                return event, None
            outcome = await watch.probe(self.probe(cfg.health_timeout_s), takes)
            if outcome in (Outcome.EXITED, Outcome.STOP, Outcome.COMMAND):
                return outcome, None
            failed = 0 if outcome is Outcome.HEALTHY else failed + 1
            if failed >= cfg.health_failures:
                return Outcome.UNHEALTHY, f"{failed} health probes in a row failed"

    async def probe(self, timeout_s: float) -> bool:
        try:
            timeout = aiohttp.ClientTimeout(total=timeout_s)
            async with self._session.get(self.url, timeout=timeout, allow_redirects=False) as resp:
                return resp.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False
