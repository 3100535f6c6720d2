"""Reads each backend's /metrics at a short interval into its ``load`` (load.py says what it means).

Only load-aware and prefix-aware routing need it, so the scraper runs only when some model uses
one of them, and only for backends in rotation.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import aiohttp

from gateway.backend import Backend, BackendSet
from gateway.load import STALL_INTERVALS, parse_load, settle
from gateway.poller import BackendPoller

log = logging.getLogger("gateway.loadscrape")


class LoadScraper(BackendPoller):
    """GET /metrics of every backend in rotation every ``interval`` seconds."""

    kind = "load scrape"

    def __init__(self, backends: BackendSet, interval: float, timeout: float, api_key: str | None,
                 count: Callable[[Backend], int], stalled: Callable[[str, bool], None]) -> None:
        super().__init__(backends, interval, interval, timeout, api_key)
        self.count = count  # the gateway's requests open to a backend (pool.Count)
        self.stalled = stalled  # told each backend's verdict when it changes (the metric)

    async def poll(self, b: Backend) -> None:
        if not b.healthy:
            return
        try:
            async with self.session.get(b.url + "/metrics") as r:
                body = await r.read()
                if r.status != 200:
                    return
        except (TimeoutError, aiohttp.ClientError) as e:
            log.debug("load scrape of %s failed: %s", b.name, e)
            return
        last = b.load
        b.load = new = settle(last, parse_load(body, time.monotonic(), self.count(b)), STALL_INTERVALS * self.interval)
        was = last is not None and last.stalled
        if last is None or new.stalled != was:
            self.stalled(b.name, new.stalled)
        if new.stalled and not was:
            log.warning("%s: /metrics says %g running and %g waiting, but no token has moved for %.0f s; "
                        "routing counts only the gateway's own requests there until one does",
                        b.name, new.running, new.waiting, new.at - new.flat_since)
