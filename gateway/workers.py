"""Several gateway processes on one port (``FLEET_WORKERS`` / ``--workers N``).

uvicorn's supervisor binds the socket once and spawns N workers that accept on it; it restarts a
worker that dies and stops them all on SIGTERM. A spawned worker cannot be handed an app object,
so it builds its own from the config path, which the parent passes in ``FLEET_GATEWAY_CONFIG``.

What the workers share, in a table each worker maps (shared.py): their in-flight counts, per
backend and in all, and their queued counts per model, so that ``backend_max_concurrency`` (or
vLLM's ``max_num_seqs``), ``max_in_flight`` and ``backend_queue`` bound the whole gateway and no
worker turns a request away while the gateway has room, and so that every policy routes by the
gateway's in-flight counts; when each model's oldest waiter queued, so that the queue is first
come, first served across workers (limiter.py); the routing turns (routing.py); passive ejection
(ejection.py) and the probes' verdicts (health.py). And in a second file, prefix-aware routing's
index (prefixshare.py), whose keys are Python's str hashes: the workers get one PYTHONHASHSEED, a
random one unless a number is set. What each keeps to itself (docs/gateway.md, "Several
workers"): its health probes (each worker probes every backend; the verdicts are shared, the
streaks are not) and its waiters (it hands slots to them, unless another worker's waiter is
older). Metrics are shared through prometheus_client's multiprocess files. All live in a private
directory that the parent creates before the workers start and removes when they are gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import tempfile
from collections.abc import Iterator

from gateway import prefixshare
from gateway.shared import SharedCounts, create

CONFIG_ENV = "FLEET_GATEWAY_CONFIG"
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
SHARED_ENV = "FLEET_SHARED_COUNTS"
PREFIXES_ENV = "FLEET_SHARED_PREFIXES"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def shared_rows(workers: int) -> int:
    # Room for replacements that start before a crashed worker's row is seen to be free.
    return 2 * workers


@contextlib.contextmanager
def worker_environment(config_path: str, workers: int, prefix_blocks: int) -> Iterator[str]:
    """What spawned workers inherit: the config path, the worker count (the ``--workers`` flag
    included), one hash seed, and a private directory for prometheus_client's per-process files,
    which must be set before any worker imports prometheus_client, and for the shared tables.
    Afterwards the directory is removed and the environment restored; yields the directory."""
    path = tempfile.mkdtemp(prefix="fleet-gateway-metrics-")
    counts = create(path, shared_rows(workers))  # not a *.db file: prometheus_client ignores it
    prefixes = prefixshare.create(path, prefixshare.slots_for(prefix_blocks))
    seed = os.environ.get("PYTHONHASHSEED", "")
    if not seed.isdigit():  # unset, or "random": each worker would hash prompts its own way
        seed = str(random.randint(1, 2**32 - 1))
    wanted = {CONFIG_ENV: os.path.abspath(config_path), "FLEET_WORKERS": str(workers), METRICS_DIR_ENV: path,
              SHARED_ENV: counts, PREFIXES_ENV: prefixes, "PYTHONHASHSEED": seed}
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
    settings = load_settings(cfg.settings)
    # A spawned worker starts with logging unconfigured; the gateway's own loggers need a handler.
    logging.basicConfig(level=settings.log_level.upper(), format=LOG_FORMAT)
    path, prefixes = os.environ.get(SHARED_ENV), os.environ.get(PREFIXES_ENV)
    if not path or settings.workers == 1:
        return FleetGateway(settings, cfg.backends, cfg.node_tier)
    shared = SharedCounts(path, shared_rows(settings.workers))
    table = (prefixshare.PrefixTable(prefixes, prefixshare.slots_for(settings.prefix_index_blocks), shared)
             if prefixes else None)
    return FleetGateway(settings, cfg.backends, cfg.node_tier, shared, table)
