"""Running the gateway: ``vllm-fleet gateway -c FILE`` and ``python -m gateway -c FILE``."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

import uvicorn

from fleetspec.errors import ConfigError
from gateway import proxy
from gateway.app import FleetGateway
from gateway.coalesce import HttpToolsProtocol
from gateway.config import load_gateway_config
from gateway.settings import MAX_WORKERS, load_settings
from gateway.workers import LOG_FORMAT, worker_environment


def build(config_path: str, workers: int | None = None) -> FleetGateway:
    """``workers`` (the ``--workers`` flag) wins over FLEET_WORKERS and the file."""
    cfg = load_gateway_config(config_path)
    settings = load_settings(cfg.settings, str(config_path))
    if workers is not None:
        if not 1 <= workers <= MAX_WORKERS:
            raise ConfigError(f"--workers: must be between 1 and {MAX_WORKERS}, got {workers}")
        settings = settings.model_copy(update={"workers": workers})
    return FleetGateway(settings, cfg.backends, cfg.node_tier)


def request_path() -> str:
    """How the request path runs: compiled by setup.py's ``VLLM_FLEET_COMPILE=1`` build, or not."""
    return "compiled with mypyc" if (proxy.__file__ or "").endswith(".so") else "interpreted"


def run_gateway(config_path: str, workers: int | None = None) -> int:
    """Serve until stopped (SIGTERM or Ctrl-C)."""
    app = build(config_path, workers)  # also validates everything before any worker starts
    s = app.settings
    logging.basicConfig(level=s.log_level.upper(), format=LOG_FORMAT)
    log = logging.getLogger("gateway")
    log.info("request path %s", request_path())
    for b in app.pool.backends:
        log.info("backend %s at %s serving %s (%s)", b.name, b.url, ", ".join(b.models) or "(discovering)",
                 b.vram_tier.value)
    opts: dict[str, Any] = dict(
        host=s.host, port=s.port, log_level=s.log_level, access_log=s.access_log,
        loop="uvloop", http=HttpToolsProtocol, lifespan="on", timeout_graceful_shutdown=10,
        # No X-Forwarded-* rewriting (nothing here reads the client address) and no Server
        # header: both cost time per request on the hot path.
        proxy_headers=False, server_header=False)
    if s.workers == 1:
        uvicorn.run(app, **opts)  # one process, today's in-memory metrics registry
        return 0
    log.info("starting %d workers", s.workers)
    with worker_environment(config_path, s.workers, s.prefix_index_blocks):
        uvicorn.run("gateway.workers:worker_app", factory=True, workers=s.workers, **opts)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m gateway", description="the vllm-fleet gateway alone (settings: FLEET_* variables)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  python -m gateway -c .fleet/infernet.json         # Infernet-style JSON, either shape\n"
               "  FLEET_PORT=9000 FLEET_API_KEYS=k1 python -m gateway -c fleet.yaml --workers 4")
    p.add_argument("-c", "--config", required=True, help="Infernet-style JSON (either shape) or a fleet file")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="server processes on the one port (default: FLEET_WORKERS, the file's gateway.workers, 1)")
    args = p.parse_args(argv)
    try:
        return run_gateway(args.config, args.workers)
    except ConfigError as e:
        print(f"gateway: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
