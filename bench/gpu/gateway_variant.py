"""A second gateway beside the fleet's, with one behaviour changed, for bisecting issue 21's TTFT
tail on the device (not a product setting):

    python3 bench/gpu/gateway_variant.py --port 8081 --variant noreuse   # a new upstream connection per request
    python3 bench/gpu/gateway_variant.py --port 8082 --variant fifo      # reuse the longest-idle connection first
    python3 bench/gpu/gateway_variant.py --port 8083 --variant plain --trace  # timestamps per request
    python3 bench/gpu/gateway_variant.py --port 8084 --variant plain --workers 2

Each is configured as the fleet's own gateway is for the one instance (``max_num_seqs`` passed on, so
the same concurrency cap).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import gateway.upstream as upstream
from gateway.connection import UpstreamConnection
from gateway.main import main


def _fifo(self: upstream.UpstreamPool, origin: upstream.Origin) -> UpstreamConnection | None:
    while origin.idle:
        conn = origin.idle.pop(0)
        if not conn.closed:
            return conn
    return None


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--variant", choices=["noreuse", "fifo", "plain"], required=True)
    ap.add_argument("--backend", default="http://127.0.0.1:8001")
    ap.add_argument("--max-num-seqs", type=int, default=1024, help="the instance's, as the fleet passes it on")
    ap.add_argument("--trace", action="store_true", help="per-request timestamps at GET /_trace (one worker)")
    ap.add_argument("--workers", type=int, default=1)
    a = ap.parse_args()
    if a.trace:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from gateway_trace import install

        install()
    if a.variant == "noreuse":
        upstream._MAX_IDLE = 0
    elif a.variant == "fifo":
        upstream.UpstreamPool._take_idle = _fifo  # type: ignore[method-assign]
    cfg = {"backend": "vllm", "vllm_instances": [{"host": a.backend, "models": ["tiny"], "name": "a",
                                      "max_num_seqs": a.max_num_seqs}],
           "served_models": ["tiny"]}
    path = os.path.join(tempfile.mkdtemp(), "infernet.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    os.environ.update(FLEET_HOST="127.0.0.1", FLEET_PORT=str(a.port))
    sys.exit(main(["-c", path, "--workers", str(a.workers)]))
