"""A control for issue 21's slower decoding at 512 (results/serve-pairs-h200-512): load the host's
CPUs as the gateway does, without a gateway in the path. Busy for ``--slice-ms``, then asleep so
that the busy share is ``--duty`` of one CPU, in short turns like the gateway's loop.
serve_pairs.py's target ``burn`` runs a direct pass with this beside it: if vLLM decodes as slowly
as through the gateway, the cause is CPU shared on the host, not the relay.

    python3 bench/gpu/burn.py --duty 0.35
"""

from __future__ import annotations

import argparse
import time


def burn(duty: float, slice_s: float) -> None:
    idle = slice_s * (1 - duty) / duty
    x = 0
    while True:
        end = time.perf_counter() + slice_s
        while time.perf_counter() < end:
            x = (x * 1103515245 + 12345) & 0xFFFFFFFF  # pure interpreter work, like the gateway's
        time.sleep(idle)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duty", type=float, default=0.35, help="the share of one CPU to keep busy "
                    "(the gateway used 0.3-0.4 of a core at 512 on H200s)")
    ap.add_argument("--slice-ms", type=float, default=0.5)
    a = ap.parse_args()
    if not 0 < a.duty < 1:
        raise SystemExit("--duty must be between 0 and 1")
    burn(a.duty, a.slice_ms / 1000)


if __name__ == "__main__":
    main()
