"""A background task per backend that polls it over one shared aiohttp session, off the hot path:
the health checker (health.py) and the load scraper (loadscrape.py). Backends added to or removed
from the set later (a live reload) get or lose their task."""

from __future__ import annotations

import asyncio
import logging
import random

import aiohttp

from gateway.backend import Backend, BackendSet
from gateway.state import BackendState

log = logging.getLogger("gateway.poller")


class BackendPoller:
    """Calls ``poll(b)`` for every backend every ``interval`` seconds, the first time after a random
    pause of up to ``spread`` seconds so that many backends are not polled all at once."""

    kind = "poll"  # names the tasks and the log lines

    def __init__(self, backends: BackendSet, interval: float, spread: float, timeout: float,
                 api_key: str | None) -> None:
        self.backends = backends
        self.interval = interval
        self._spread = spread
        self._timeout = timeout
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session: aiohttp.ClientSession | None = None
        self._tasks: dict[Backend, asyncio.Task[None]] = {}
        backends.subscribe(self._membership)

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "start() first"
        return self._session

    async def poll(self, b: Backend) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout),
                                              headers=self._headers)
        for b in self.backends:
            self._spawn(b)

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _membership(self, b: Backend, old: BackendState | None, new: BackendState | None) -> None:
        if self._session is None:
            return  # not started: start() spawns a task for every member
        if old is None:
            self._spawn(b)
        elif new is None:
            task = self._tasks.pop(b, None)
            if task is not None:
                task.cancel()

    def _spawn(self, b: Backend) -> None:
        if b not in self._tasks:
            self._tasks[b] = asyncio.create_task(self._loop(b), name=f"{self.kind}:{b.name}")

    async def _loop(self, b: Backend) -> None:
        await asyncio.sleep(random.uniform(0, self._spread))
        while True:
            try:
                await self.poll(b)
            except Exception:  # a bug in one poll must not end the loop that keeps routing honest
                log.exception("%s of %s failed unexpectedly", self.kind, b.name)
            await asyncio.sleep(self.interval)
