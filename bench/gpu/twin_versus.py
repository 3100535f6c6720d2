"""Two settings' twin runs side by side: each measure's swap pairs under one and under the other.

A swap pair's ratio (gateway ÷ direct, twin_stats.py) already cancels the GPU and the minute it
ran in; comparing two settings of the gateway (say its warm pool at vLLM's ``--max-num-seqs``
against 512) then compares two samples of those ratios, taken on different machines. With a
dozen pairs each and ratios that spread by a third, a difference of medians says little alone:
this prints the exact two-sided rank-sum (Mann-Whitney) p beside it. Then each path's own
readings under each setting, for a setting that moves both paths alike (vLLM's
``--api-server-count``, results/twin-api2-h200x2): those do not cancel the machine, so read them
beside how far the machines of one setting spread.

    python3 bench/gpu/twin_versus.py --conc 512 --a ROWS... --b ROWS...
    python3 bench/gpu/twin_versus.py --conc 512 --a ROWS --b ROWS --b-idle 512   # one run's gb/ga against its gbi/gai
    python3 bench/gpu/twin_versus.py --conc 512 --a ROWS --b ROWS --b-idle 512 --b-by holder   # ... its gbh/gah
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from functools import cache
from typing import Any

from twin_stats import gateway_windows, load, swap_pairs, variant

MEASURES = (("tokens/s", "output_throughput"), ("TTFT p50", "median_ttft_ms"), ("TTFT p99", "p99_ttft_ms"),
            ("TTFT mean", "mean_ttft_ms"), ("request's life mean", "mean_life_ms"))


@cache
def _ways(m: int, n: int, u: int) -> int:
    """Orderings of ``m`` values of one sample among ``n`` of the other with exactly ``u`` pairs
    in which the first sample's value is the larger (no ties)."""
    if u < 0:
        return 0
    if m == 0 or n == 0:
        return 1 if u == 0 else 0
    # the largest value of all is either the first sample's (above all n of the other) or not
    return _ways(m - 1, n, u - n) + _ways(m, n - 1, u)


def rank_sum_p(xs: list[float], ys: list[float]) -> float:
    """Exact two-sided Mann-Whitney p of ``xs`` against ``ys`` (ties count half, with the
    untied distribution: fine for ratios measured to many digits)."""
    m, n = len(xs), len(ys)
    u = sum(1.0 if x > y else 0.5 if x == y else 0.0 for x in xs for y in ys)
    total = sum(_ways(m, n, k) for k in range(m * n + 1))
    low = sum(_ways(m, n, k) for k in range(m * n + 1) if k <= u) / total
    high = sum(_ways(m, n, k) for k in range(m * n + 1) if k >= u) / total
    return min(1.0, 2 * min(low, high))


def rank_sum_p_normal(xs: list[float], ys: list[float]) -> float:
    """Two-sided Mann-Whitney p of ``xs`` against ``ys`` by the normal approximation with the tie
    correction, for samples where rank_sum_p's exact sum takes minutes (82 against 82) or that
    tie often (engine counts)."""
    m, n = len(xs), len(ys)
    ranked = sorted(xs + ys)
    first: dict[float, int] = {}
    ties: dict[float, int] = {}
    for i, v in enumerate(ranked):
        first.setdefault(v, i)
        ties[v] = ties.get(v, 0) + 1
    rank = {v: first[v] + (ties[v] + 1) / 2 for v in ties}  # 1-based mean rank of each value
    u = sum(rank[x] for x in xs) - m * (m + 1) / 2
    total = m + n
    var = m * n / 12 * (total + 1 - sum(t ** 3 - t for t in ties.values()) / (total * (total - 1)))
    if var <= 0:
        return 1.0
    z = (abs(u - m * n / 2) - 0.5) / math.sqrt(var)  # with the continuity correction
    return min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))


def versus(a_paths: list[str], b_paths: list[str], conc: int, a_idle: int = 0, b_idle: int = 0,
           a_by: str = "client", b_by: str = "client") -> str:
    """The table: each measure's median of swap pairs under each setting and the rank-sum p. Each
    side takes the passes whose direct side held ``a_idle`` / ``b_idle`` idle connections (0: the
    plain ``gb``/``ga``; twin_pairs.py's ``gbi``/``gai`` hold some in the client, ``a_by`` /
    ``b_by`` "client"; ``gbh``/``gah`` in a process of their own, "holder"), engines never apart."""
    a_rows, b_rows = ([r for r in load(p) if r["conc"] == conc and variant(r) == (False, i, by if i else "")]
                      for p, i, by in ((a_paths, a_idle, a_by), (b_paths, b_idle, b_by)))
    lines = [f"Swap pairs at {conc} streams, gateway ÷ direct: median (lowest–highest), how many above 1\n",
             "| measure | A | B | rank-sum p, A against B |", "|---|---|---|---|"]
    for name, key in MEASURES:
        a, b = swap_pairs(a_rows, key), swap_pairs(b_rows, key)
        if not a or not b:
            continue
        cells = [f"{statistics.median(xs):.3f} ({min(xs):.3f}–{max(xs):.3f}), {sum(x > 1 for x in xs)} of {len(xs)}"
                 for xs in (a, b)]
        lines.append(f"| {name} | {cells[0]} | {cells[1]} | {rank_sum_p(a, b):.2f} |")
    return "\n".join(lines + levels(a_rows, b_rows, conc))


def _figure(r: dict[str, Any], path: str, side: dict[str, Any], key: str) -> float | None:
    """A side's client figure, or with ``cores`` its instance's vLLM processes' CPU (in_pass.engine:
    the process `up` started and all below it: its API servers, its engine core)."""
    if key != "cores":
        return side.get(key)
    e = r.get("engine", {}).get(path) or {}
    return None if e.get("api_cpu") is None or e.get("engine_cpu") is None else e["api_cpu"] + e["engine_cpu"]


def levels(a_rows: list[dict[str, Any]], b_rows: list[dict[str, Any]], conc: int) -> list[str]:
    """Each path's own tokens/s, TTFT and vLLM's CPU under A and under B over the gb/ga passes:
    median (lowest–highest) and B's median ÷ A's."""
    lines = ["\nEach path's own readings over the passes: median (lowest–highest), B's median ÷ A's\n",
             "| path | measure | A | B | B ÷ A |", "|---|---|---|---|---|"]
    for path in ("direct", "gateway"):
        for name, key, fmt in (*((n, k, ",.0f") for n, k in MEASURES[:3]), ("vLLM's processes, cores", "cores", ".2f")):
            a, b = ([v for r, side_path, side in gateway_windows(rows, conc) if side_path.startswith(path + ":")
                     and (v := _figure(r, side_path, side, key)) is not None] for rows in (a_rows, b_rows))
            if a and b:
                cells = [f"{statistics.median(xs):{fmt}} ({min(xs):{fmt}}–{max(xs):{fmt}}), {len(xs)}" for xs in (a, b)]
                lines.append(f"| {path} | {name} | {cells[0]} | {cells[1]} | "
                             f"{statistics.median(b) / statistics.median(a):.2f} |")
    return lines


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conc", type=int, required=True)
    ap.add_argument("--a", nargs="+", required=True, help="one setting's rows files (swap pairs never span two)")
    ap.add_argument("--b", nargs="+", required=True, help="the other setting's")
    ap.add_argument("--a-idle", type=int, default=0, help="A's passes whose direct side held this many idle ones")
    ap.add_argument("--b-idle", type=int, default=0, help="B's alike (512: a run's gbi/gai passes)")
    for side in ("a", "b"):
        ap.add_argument(f"--{side}-by", choices=["client", "holder"], default="client",
                        help=f"who held {side.upper()}'s idle connections: the client (gbi/gai) or a process "
                        "of their own (gbh/gah)")
    a = ap.parse_args(argv)
    print(versus(a.a, a.b, a.conc, a.a_idle, a.b_idle, a.a_by, a.b_by))


if __name__ == "__main__":
    main(sys.argv[1:])
