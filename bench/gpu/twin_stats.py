"""twin_pairs.py's rows as gateway ÷ direct ratios with their intervals, and how noisy each design is.

    python3 bench/gpu/twin_stats.py W/rows.json [more rows.json ...]

Per concurrency, for tokens/s, TTFT p50/p99, the mean gap between tokens and the requests in
flight:
- each pass's ratio, the gateway side ÷ the direct side of the same seconds;
- a swap pair: a ``gb`` pass and the ``ga`` next to it (which GPU and which client core each path
  had, swapped), their ratios' geometric mean, so that a difference between the GPUs or the cores
  cancels; the median of the swap pairs, a 90 % bootstrap interval (pairs resampled) and how many
  are above 1;
- three spreads, as the standard deviation of log ratios: the swap pairs'; ``aa`` passes' b ÷ a
  (two direct sides at once: the noise floor of this design); and one instance served direct in
  one pass ÷ the next pass it was served direct in, minutes apart (what sequential pairs face);
- the swap pairs a 90 % interval of ±1 % or ±5 % would take at the swap pairs' spread;
- with each second's tokens in the rows (window_client.py since 2026-11-26): the ``aa`` passes'
  b ÷ a over sub-windows of T seconds. A spread that falls as 1/√T (× √T constant) is noise a
  longer window averages out; one that stays flat belongs to the pass, and only more passes help.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics
import sys
from pathlib import Path
from typing import Any

from pair_stats import _boot_pairs, _log_sd, _needed

KEYS = (("output_throughput", "tokens/s"), ("median_ttft_ms", "TTFT p50"), ("p99_ttft_ms", "TTFT p99"),
        ("mean_itl_ms", "mean gap between tokens"), ("mean_in_flight", "requests in flight"))


def pass_ratio(row: dict[str, Any], key: str) -> float | None:
    """A ``gb``/``ga`` pass's gateway side ÷ its direct side, an ``aa`` pass's b ÷ a."""
    s = row["sides"]
    if row["kind"] == "aa":
        num, den = s.get("direct:b", {}).get(key), s.get("direct:a", {}).get(key)
    else:
        num = next((v.get(key) for p, v in s.items() if p.startswith("gateway")), None)
        den = next((v.get(key) for p, v in s.items() if p.startswith("direct")), None)
    return num / den if num and den else None


def swap_pairs(rows: list[dict[str, Any]], key: str) -> list[float]:
    """Each ``gb`` with the ``ga`` that follows or precedes it in run order, one pass in one pair."""
    out, held = [], None
    for r in rows:
        if r["kind"] == "aa" or (ratio := pass_ratio(r, key)) is None:
            continue
        if held is not None and held[0] != r["kind"]:
            out.append(math.sqrt(held[1] * ratio))
            held = None
        else:
            held = (r["kind"], ratio)
    return out


def sequential(rows: list[dict[str, Any]], key: str) -> list[float]:
    """One instance's direct side ÷ its direct side in the next pass it was served direct in."""
    out = []
    for inst in ("a", "b"):
        series = [v for r in rows if (v := r["sides"].get(f"direct:{inst}", {}).get(key))]
        out += [b / a for a, b in itertools.pairwise(series)]
    return out


def sub_windows(rows: list[dict[str, Any]]) -> dict[int, list[float]]:
    """T -> b ÷ a of tokens over each T-second piece of every ``aa`` pass's window (T dividing it)."""
    series = [(a, b) for r in rows if r["kind"] == "aa"
              and (a := r["sides"].get("direct:a", {}).get("tokens_each_second"))
              and (b := r["sides"].get("direct:b", {}).get("tokens_each_second")) and len(a) == len(b)]
    out: dict[int, list[float]] = {}
    for a, b in series:
        for t in (t for t in range(1, len(a) + 1) if len(a) % t == 0):
            out.setdefault(t, []).extend(sum(b[i:i + t]) / sum(a[i:i + t]) for i in range(0, len(a), t)
                                         if sum(a[i:i + t]) and sum(b[i:i + t]))
    return out


def _sub_table(group: list[dict[str, Any]]) -> list[str]:
    subs = {t: v for t, v in sub_windows(group).items() if len(v) > 1}
    if not subs:
        return []
    sds = {t: statistics.stdev(math.log(x) for x in v) for t, v in subs.items()}
    return ["\naa passes, tokens/s b ÷ a over sub-windows of T s:\n",
            "| T, s | " + " | ".join(map(str, sds)) + " |", "|---|" + "---|" * len(sds),
            "| sd of log ratio (n) | " + " | ".join(f"{sd:.3f} ({len(subs[t])})" for t, sd in sds.items()) + " |",
            "| sd × √T | " + " | ".join(f"{sd * math.sqrt(t):.3f}" for t, sd in sds.items()) + " |"]


def report(rows: list[dict[str, Any]]) -> str:
    lines = []
    rng = random.Random(21)
    for conc in sorted({r["conc"] for r in rows}):
        group = [r for r in rows if r["conc"] == conc]
        kinds = {k: sum(1 for r in group if r["kind"] == k) for k in ("gb", "ga", "aa")}
        lines += [f"\n### {conc:,} streams per side ({kinds['gb']} gb, {kinds['ga']} ga, {kinds['aa']} aa passes; "
                  f"{sum(r.get('queued', 0) for r in group)} requests queued in the gateway)\n",
                  "| measure | gateway ÷ direct, median of swap pairs (90 % interval), above 1 | passes gb / ga "
                  "| sd: swap pairs (n) | sd: aa, b ÷ a at once (n) | sd: one instance, pass to pass (n) "
                  "| swap pairs for ±1 % / ±5 % |",
                  "|---|---|---|---|---|---|---|"]
        for key, label in KEYS:
            pairs = swap_pairs(group, key)
            by_kind = {k: [f"{v:.3f}" for r in group if r["kind"] == k and (v := pass_ratio(r, key))]
                       for k in ("gb", "ga")}
            aa = [v for r in group if r["kind"] == "aa" and (v := pass_ratio(r, key))]
            seq = sequential(group, key)
            if pairs:
                lo, hi = _boot_pairs(pairs, rng) if len(pairs) > 1 else (pairs[0], pairs[0])
                mid = (f"{statistics.median(pairs):.3f} ({lo:.3f}–{hi:.3f}), "
                       f"{sum(p > 1 for p in pairs)} of {len(pairs)}")
            else:
                mid = "—"
            lines.append(f"| {label} | {mid} | {' '.join(by_kind['gb']) or '—'} / {' '.join(by_kind['ga']) or '—'} "
                         f"| {_log_sd(pairs)} ({len(pairs)}) | {_log_sd(aa)} ({len(aa)}) | {_log_sd(seq)} ({len(seq)}) "
                         f"| {_needed(pairs, 0.01)} / {_needed(pairs, 0.05)} |")
        cpu = [r["gateway_cpu_share"] for r in group if r["kind"] != "aa" and "gateway_cpu_share" in r]
        client = [s["client_cpu_share"] for r in group for s in r["sides"].values() if "client_cpu_share" in s]
        if cpu and client:
            lines.append(f"\nGateway CPU over a pass: {min(cpu):.2f}–{max(cpu):.2f} of a core; each client over "
                         f"its window: {min(client):.2f}–{max(client):.2f}.")
        lines += _sub_table(group)
    return "\n".join(lines)


def main(paths: list[str]) -> None:
    rows = [r for p in paths for r in json.loads(Path(p).read_text())]
    print(report(rows))


if __name__ == "__main__":
    main(sys.argv[1:])
