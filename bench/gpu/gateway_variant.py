"""A second gateway beside the fleet's, with one behaviour changed, for bisecting issue 21's TTFT
tail on the device (not a product setting):

    python3 bench/gpu/gateway_variant.py --port 8081 --variant noreuse   # a new upstream connection per request
    python3 bench/gpu/gateway_variant.py --port 8082 --variant fifo      # reuse the longest-idle connection first
    python3 bench/gpu/gateway_variant.py --port 8083 --variant plain --trace  # timestamps per request
    python3 bench/gpu/gateway_variant.py --port 8084 --variant plain --workers 2
    python3 bench/gpu/gateway_variant.py --port 8081 --variant switch --config /tmp/fleet-state/infernet.json

Each is configured as the fleet's own gateway is for the one instance (``max_num_seqs`` passed on, so
the same concurrency cap), or with ``--config`` reads the fleet's own file. ``switch`` (pick_pairs.py)
is the shipped gateway whose pool takes an idle connection at random after SIGUSR1 (the pick of
e437f7c, beside the pool's balancing) and as shipped again after SIGUSR2: the same pool, the same
connections, only the pick differs between passes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile

import gateway.upstream as upstream
from gateway.connection import UpstreamConnection
from gateway.main import main


def _fifo(origin: upstream.Origin) -> UpstreamConnection | None:
    """The longest idle connection (of the first process holding one)."""
    for idle in origin.idle.values():
        while idle:
            conn = idle.pop(0)
            if not conn.closed:
                return conn
    return None


_shipped = upstream.UpstreamPool._take_idle
_pick = {"random": False}


def _random(origin: upstream.Origin) -> UpstreamConnection | None:
    """Any idle connection, each as likely, whichever process serves it."""
    while lists := [idle for idle in origin.idle.values() if idle]:
        i = int(random.random() * sum(map(len, lists)))
        for idle in lists:
            if i < len(idle):
                break
            i -= len(idle)
        conn, idle[i] = idle[i], idle[-1]  # a swap with the last, then pop, as e437f7c did
        idle.pop()
        if not conn.closed:
            return conn
    return None


def _switch(origin: upstream.Origin) -> UpstreamConnection | None:
    return _random(origin) if _pick["random"] else _shipped(origin)


def _set(random_pick: bool) -> None:
    _pick["random"] = random_pick
    print(f"pick: {'random' if random_pick else 'shipped'}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--variant", choices=["noreuse", "fifo", "plain", "switch"], required=True)
    ap.add_argument("--config", help="the fleet's infernet.json instead of one instance at --backend")
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
        upstream.UpstreamPool._take_idle = staticmethod(_fifo)  # type: ignore[method-assign]
    elif a.variant == "switch":
        upstream.UpstreamPool._take_idle = staticmethod(_switch)  # type: ignore[method-assign]
        signal.signal(signal.SIGUSR1, lambda *_: _set(True))
        signal.signal(signal.SIGUSR2, lambda *_: _set(False))
    cfg = {"backend": "vllm", "vllm_instances": [{"host": a.backend, "models": ["tiny"], "name": "a",
                                      "max_num_seqs": a.max_num_seqs}],
           "served_models": ["tiny"]}
    path = a.config or os.path.join(tempfile.mkdtemp(), "infernet.json")
    if not a.config:
        with open(path, "w") as f:
            json.dump(cfg, f)
    os.environ.update(FLEET_HOST="127.0.0.1", FLEET_PORT=str(a.port))
    sys.exit(main(["-c", path, "--workers", str(a.workers)]))
