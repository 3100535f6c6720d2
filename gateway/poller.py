"""A background task per backend that polls it over one shared aiohttp session, off the hot path:
the health checker (health.py) and the load scraper (loadscrape.py)."""

from __future__ import annotations

import asyncio
import logging
import random

import aiohttp

from gateway.backend import Backend

log = logging.getLogger("gateway.poller")


class BackendPoller:
    """Calls ``poll(b)`` for every backend every ``interval`` seconds, the first time after a random
    pause of up to ``spread`` seconds so that many backends are not polled all at once."""

    kind = "poll"  # names the tasks and the log lines

    def __init__(self, backends: list[Backend], interval: float, spread: float, timeout: float,
                 api_key: str | None) -> None:
        self.backends = backends
        self.interval = interval
        self._spread = spread
        self._timeout = timeout
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "start() first"
        return self._session

    async def poll(self, b: Backend) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout),
                                              headers=self._headers)
        self._tasks = [asyncio.create_task(self._loop(b), name=f"{self.kind}:{b.name}") for b in self.backends]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._session is not None:
            await self._session.close()

    async def _loop(self, b: Backend) -> None:
        await asyncio.sleep(random.uniform(0, self._spread))
        while True:
            try:
                await self.poll(b)
            except Exception:  # a bug in one poll must not end the loop that keeps routing honest
                log.exception("%s of %s failed unexpectedly", self.kind, b.name)
            await asyncio.sleep(self.interval)
