"""Running the gateway: ``vllm-fleet gateway -c FILE`` and ``python -m gateway -c FILE``."""

from __future__ import annotations

import argparse
import logging
import sys

import uvicorn

from fleetspec.errors import ConfigError
from gateway.app import FleetGateway
from gateway.config import load_gateway_config
from gateway.settings import load_settings


def build(config_path: str) -> FleetGateway:
    cfg = load_gateway_config(config_path)
    settings = load_settings(cfg.settings)
    return FleetGateway(settings, cfg.backends, cfg.node_tier)


def run_gateway(config_path: str) -> int:
    app = build(config_path)
    s = app.settings
    logging.basicConfig(level=s.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("gateway")
    for b in app.pool.backends:
        log.info("backend %s at %s serving %s (%s)", b.name, b.url, ", ".join(b.models) or "(discovering)",
                 b.vram_tier.value)
    uvicorn.run(app, host=s.host, port=s.port, log_level=s.log_level, access_log=s.access_log,
                loop="uvloop", http="httptools", lifespan="on", timeout_graceful_shutdown=10,
                # No X-Forwarded-* rewriting (nothing here reads the client address) and no Server
                # header: both cost time per request on the hot path.
                proxy_headers=False, server_header=False)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gateway", description="the vllm-fleet gateway alone")
    p.add_argument("-c", "--config", required=True, help="Infernet-style JSON (either shape) or a fleet file")
    args = p.parse_args(argv)
    try:
        return run_gateway(args.config)
    except ConfigError as e:
        print(f"gateway: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
