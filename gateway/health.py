"""Active health checks: GET /health on every backend, and model discovery from /v1/models.

/health is the probe because vLLM's /v1/models stays 200 while its engine hangs (DESIGN §3).
/v1/models is read only to learn names (when the config gives a bare host) and model cards,
each time a backend comes (back) into rotation, since a restarted server may serve other names.

A writer of backend state (docs/architecture.md §2): it records probe results on the backend and
sets its models; whatever must follow (the prefix index forgets, queued requests get the slot,
metrics) subscribes to the backend set. A backend that the supervisor hands back (UNKNOWN after
sleeping, draining or a restart) is probed at once rather than at the next interval, since
requests may be waiting for it.

With several workers (shared.py) each worker probes every backend, and a move its own probes make
is published with its time. Every ``shared.SYNC_S`` each worker adopts the freshest such verdict of any
worker that is newer than its own last change of that backend (so a verdict from before a
supervisor's hand-back or an ejection never counts), and starts its own streaks over. The first
worker to see ``health_failures`` bad probes takes the backend out of every worker's rotation; the
first to see ``health_successes`` good ones brings it back everywhere (an ejected one only once its
ejection, shared too, has ended). Supervisor states are not adopted: every worker hears them itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp

from gateway.backend import Backend, BackendSet
from gateway.poller import BackendPoller
from gateway.settings import GatewaySettings
from gateway.shared import PROBED, Follower, SharedCounts, column_of, publish
from gateway.state import PROBE_STATES, BackendState, Writer

log = logging.getLogger("gateway.health")

# A published verdict: wall-clock microseconds × 4 + one of these codes.
_CODES = {BackendState.HEALTHY: 1, BackendState.UNHEALTHY: 2}
_VERDICTS = {code: state for state, code in _CODES.items()}


class HealthChecker(BackendPoller):
    kind = "health probe"

    def __init__(self, backends: BackendSet, settings: GatewaySettings,
                 count_probe: Callable[[str, bool], None] | None = None, shared: SharedCounts | None = None) -> None:
        super().__init__(backends, settings.health_interval_s, min(0.2, settings.health_interval_s),
                         settings.health_timeout_s, settings.upstream_api_key)
        self.settings = settings
        self.shared = shared
        self._count_probe = count_probe  # (backend name, ok) -> None: the probe counter
        self._urgent: set[asyncio.Task[None]] = set()
        self._follower = Follower(self.follow_once, "probe-sync") if shared is not None else None
        backends.subscribe(self._handed_back)

    async def start(self) -> None:
        await super().start()
        if self._follower is not None:
            self._follower.start()

    async def stop(self) -> None:
        if self._follower is not None:
            await self._follower.stop()
        await super().stop()

    async def poll(self, b: Backend) -> None:
        await self.probe_once(b)

    async def probe_once(self, b: Backend) -> None:
        ok, error = await self._probe(b)
        if self._count_probe is not None:
            self._count_probe(b.name, ok)
        if b.record_probe(ok, error, self.settings.health_failures, self.settings.health_successes):
            if b.state in _CODES:
                publish(self.shared, b, int(b.last_change * 1e6) * 4 + _CODES[b.state], PROBED)
            log.log(logging.INFO if b.healthy else logging.WARNING, "backend %s (%s) is now %s%s",
                    b.name, b.url, b.state.value, f": {error}" if error else "")
            if b.healthy:
                await self._discover(b)
        elif b.healthy and not b.models:
            await self._discover(b)

    def follow_once(self) -> None:
        """Adopt the other workers' verdicts that are newer than this worker's own view."""
        for b in list(self.backends):
            col = column_of(self.shared, b)
            if col is None or self.shared is None or b.state not in PROBE_STATES:
                continue
            latest = self.shared.largest(col, PROBED)
            new = _VERDICTS.get(latest % 4)
            if new is None or new is b.state or latest // 4 / 1e6 <= b.last_change:
                continue
            if b.state is BackendState.EJECTED and new is BackendState.HEALTHY and time.time() < b.ejected_until:
                continue
            b.ok_streak = b.fail_streak = 0
            b.last_error = None if new is BackendState.HEALTHY else "another gateway worker's probes failed"
            b.move(Writer.PROBE, new)
            log.log(logging.INFO if b.healthy else logging.WARNING, "backend %s (%s) is now %s (another gateway "
                    "worker's probes)", b.name, b.url, b.state.value)
            if b.healthy and not b.models:
                self._soon(self._discover(b), f"discover:{b.name}")

    def _soon(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._urgent.add(task)
        task.add_done_callback(self._urgent.discard)

    def _handed_back(self, b: Backend, old: BackendState | None, new: BackendState | None) -> None:
        # Only the supervisor moves a known backend back to UNKNOWN (state.py): it woke it, started
        # it again, or ended its drain.
        if new is BackendState.UNKNOWN and old is not None and self._session is not None:
            self._soon(self.probe_once(b), f"probe-now:{b.name}")

    async def _probe(self, b: Backend) -> tuple[bool, str | None]:
        try:
            async with self.session.get(b.url + "/health") as r:
                await r.read()
                return (True, None) if r.status == 200 else (False, f"/health answered {r.status}")
        except TimeoutError:
            return False, f"/health timed out after {self.settings.health_timeout_s}s"
        except aiohttp.ClientError as e:
            return False, f"/health failed: {e.__class__.__name__}: {e}"

    async def _discover(self, b: Backend) -> None:
        try:
            async with self.session.get(b.url + "/v1/models") as r:
                body: Any = await r.json(content_type=None) if r.status == 200 else None
        except (TimeoutError, aiohttp.ClientError, ValueError) as e:
            log.warning("could not list models of %s: %s", b.name, e)
            return
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            return
        cards = {c["id"]: c for c in data if isinstance(c, dict) and isinstance(c.get("id"), str)}
        b.cards = cards
        # Configured names are the contract; only a bare host takes its names from upstream.
        names = b.configured_models or list(cards)
        if names != b.models:
            self.backends.set_models(b, names)
            log.info("backend %s serves %s", b.name, ", ".join(names))
