"""twin_stats.py --slow-ttft-ms: twin passes sorted by which side's TTFT p50 was slow.

At 512 streams under vLLM's defaults, a side's window either runs most of its streams in vLLM's
engine or about half, the rest waiting inside vLLM's API server with TTFT p50 two to three times
longer (bench/gpu/results/twin-defaults-h200x2). A median of swap pairs then counts how often each
side fell into the slow mode more than it measures a shift; this table shows the count.
"""

from __future__ import annotations

import math
import statistics
from typing import Any


def sign_test(k: int, n: int) -> float:
    """Two-sided exact binomial p of ``k`` of ``n`` going one way, under even odds."""
    tail = sum(math.comb(n, i) for i in range(min(k, n - k) + 1)) / 2**n
    return min(1.0, 2 * tail)


def fisher_p(a: int, n1: int, c: int, n2: int) -> float:
    """Exact two-sided Fisher p of ``a`` of ``n1`` against ``c`` of ``n2``: the tables with these
    margins no likelier than the one seen."""
    k, n = a + c, n1 + n2

    def prob(i: int) -> float:
        return math.comb(n1, i) * math.comb(n2, k - i) / math.comb(n, k)

    seen = prob(a)
    return min(1.0, sum(prob(i) for i in range(max(0, k - n2), min(n1, k) + 1) if prob(i) <= seen * (1 + 1e-9)))


def modes_table(group: list[dict[str, Any]], slow_ms: float) -> list[str]:
    """The ``gb``/``ga`` passes by which side's TTFT p50 was above ``slow_ms``, the TTFT p50 ratio of each
    group and a sign test on the passes with one side slow."""
    buckets: dict[str, list[float]] = {"neither": [], "both": [], "the gateway's only": [],
                                       "the direct side's only": []}
    for r in group:
        if r["kind"] not in ("gb", "ga"):
            continue
        by_path = {path.split(":")[0]: side for path, side in r["sides"].items()}
        g, d = (by_path.get(p, {}).get("median_ttft_ms") for p in ("gateway", "direct"))
        if not g or not d:
            continue
        slow = (g > slow_ms, d > slow_ms)
        key = {(False, False): "neither", (True, True): "both", (True, False): "the gateway's only",
               (False, True): "the direct side's only"}[slow]
        buckets[key].append(g / d)
    if not any(buckets.values()):
        return []
    lines = [f"\nPasses by which side's TTFT p50 was above {slow_ms:g} ms:\n",
             "| which side was slow | passes | TTFT p50, gateway ÷ direct: median (lowest–highest) |",
             "|---|---|---|"]
    for key, xs in buckets.items():
        spread = f"{statistics.median(xs):.3f} ({min(xs):.3f}–{max(xs):.3f})" if xs else "—"
        lines.append(f"| {key} | {len(xs)} | {spread} |")
    one, other = len(buckets["the gateway's only"]), len(buckets["the direct side's only"])
    if n := one + other:
        lines.append(f"\nSign test on the {n} passes with one side slow: p = {sign_test(one, n):.2f}.")
    return lines
