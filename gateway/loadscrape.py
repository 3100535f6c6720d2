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
from gateway.load import parse_load
from gateway.poller import BackendPoller

log = logging.getLogger("gateway.loadscrape")


class LoadScraper(BackendPoller):
    """GET /metrics of every backend in rotation every ``interval`` seconds."""

    kind = "load scrape"

    def __init__(self, backends: BackendSet, interval: float, timeout: float, api_key: str | None,
                 count: Callable[[Backend], int]) -> None:
        super().__init__(backends, interval, interval, timeout, api_key)
        self.count = count  # the gateway's requests open to a backend (pool.Count)

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
        b.load = parse_load(body, time.monotonic(), self.count(b))
