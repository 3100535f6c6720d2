"""Several gateway processes on one port (``FLEET_WORKERS`` / ``--workers N``), sharing no state.

uvicorn's supervisor binds the socket once and spawns N workers that accept on it; it restarts a
worker that dies and stops them all on SIGTERM. A spawned worker cannot be handed an app object,
so it builds its own from the config path, which the parent passes in ``FLEET_GATEWAY_CONFIG``.

What each worker keeps to itself (README, "Several workers"): its backend pool and in-flight
counts (least-in-flight balances its own requests), its health probes (each worker probes every
backend), passive ejection, routing state, and its limiter. The limiter's totals are divided
among the workers (rounded up) so that the configured limits still bound the whole gateway;
the price is that one worker may be full while another has room. Metrics are shared through
prometheus_client's multiprocess files in a private directory that the parent creates before
the workers start and removes when they are gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator

from gateway.settings import GatewaySettings

CONFIG_ENV = "FLEET_GATEWAY_CONFIG"
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def share(settings: GatewaySettings) -> GatewaySettings:
    """One worker's part of the gateway-wide limits: each total divided by the worker count,
    rounded up (a total of 0, "no limit", stays 0), so N workers together stay within the total
    plus at most N-1."""
    n = settings.workers
    if n == 1:
        return settings

    def part(total: int | None) -> int | None:
        return None if total is None else -(-total // n)

    return settings.model_copy(update={
        "backend_max_concurrency": part(settings.backend_max_concurrency),
        "backend_queue": part(settings.backend_queue),
        "max_in_flight": part(settings.max_in_flight),
    })


@contextlib.contextmanager
def worker_environment(config_path: str, workers: int) -> Iterator[str]:
    """What spawned workers inherit: the config path, the worker count (the ``--workers`` flag
    included), and a private directory for prometheus_client's per-process files, which must be
    set before any worker imports prometheus_client. Afterwards the directory is removed and the
    environment restored; yields the directory."""
    path = tempfile.mkdtemp(prefix="fleet-gateway-metrics-")
    wanted = {CONFIG_ENV: os.path.abspath(config_path), "FLEET_WORKERS": str(workers), METRICS_DIR_ENV: path}
    before = {k: os.environ.get(k) for k in wanted}
    os.environ.update(wanted)
    try:
        yield path
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(path, ignore_errors=True)


def worker_app() -> object:
    """uvicorn's factory in each worker process: the app for the config the parent loaded."""
    from gateway.app import FleetGateway
    from gateway.config import load_gateway_config
    from gateway.settings import load_settings

    cfg = load_gateway_config(os.environ[CONFIG_ENV])
    settings = share(load_settings(cfg.settings))
    # A spawned worker starts with logging unconfigured; the gateway's own loggers need a handler.
    logging.basicConfig(level=settings.log_level.upper(), format=LOG_FORMAT)
    return FleetGateway(settings, cfg.backends, cfg.node_tier)
