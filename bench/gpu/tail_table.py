"""The table of issue 21's TTFT-tail runs from their rows files (serve_pairs.py --probe output):

    python3 bench/gpu/tail_table.py bench/gpu/results/serve-tail-1/rows-*.json

Per target over every pass: the median (min–max) of tokens/s and TTFT p50/p99; per file, the
gateway/direct ratio of the medians; and the gateway's client-side share (client mean TTFT minus
the gateway's own mean time to first byte)."""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any

KEYS = (("output_throughput", "tokens/s"), ("median_ttft_ms", "TTFT p50 ms"), ("p99_ttft_ms", "TTFT p99 ms"))


def _cell(vals: list[float]) -> str:
    return f"{statistics.median(vals):,.0f} ({min(vals):,.0f}–{max(vals):,.0f}), n={len(vals)}"


def main(paths: list[str]) -> None:
    files: dict[str, list[dict[str, Any]]] = {}
    for p in paths:
        with open(p) as f:
            files[p] = json.load(f)
    rows: list[dict[str, Any]] = [r for rs in files.values() for r in rs]
    targets = sorted({r["target"] for r in rows}, key=lambda t: (t != "direct", t != "gateway", t))
    print("| target | " + " | ".join(k[1] for k in KEYS) + " |")
    print("|---|" + "---|" * len(KEYS))
    for t in targets:
        print(f"| {t} | " + " | ".join(_cell([r[k] for r in rows if r["target"] == t]) for k, _ in KEYS) + " |")
    print()
    ratios = " | ".join(f"{k[1]} gateway ÷ direct" for k in KEYS)
    print(f"| file | passes | {ratios} | client TTFT − gateway TTFB, mean ms |")
    print("|---|---|" + "---|" * (len(KEYS) + 1))
    for p, rs in files.items():
        med = {t: {k: statistics.median([r[k] for r in rs if r["target"] == t]) for k, _ in KEYS}
               for t in ("direct", "gateway")}
        side = [r["mean_ttft_ms"] - r["gateway_ttfb_mean_ms"] for r in rs
                if r["target"] == "gateway" and r.get("gateway_ttfb_mean_ms")]
        n = sum(r["target"] == "gateway" for r in rs)
        print(f"| {p.rsplit('/', 1)[-1]} | {n} | " + " | ".join(f"{med['gateway'][k] / med['direct'][k]:.2f}"
                                                          for k, _ in KEYS)
              + f" | {statistics.mean(side):.0f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
