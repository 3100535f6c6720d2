"""How sure the GPU benchmark's gateway ÷ direct ratios are (issue 21), from serve_pairs.py rows files:

    python3 bench/gpu/pair_stats.py bench/gpu/results/serve-trace-1/rows-*.json
    python3 bench/gpu/pair_stats.py --pool A/rows-512-k1.json B/rows-512-k1.json   # one table

Per file (or over all files with ``--pool``), concurrency and client processes, for tokens/s, TTFT
p50/p99 and the requests held in flight: each target's median (min–max, n); the ratio of the
medians to direct's; the median of the ratios within each interleaved pair (pass i of the target ÷
pass i of direct of the same file, run back to back); a 90 % bootstrap interval of the ratio of
medians (passes resampled with replacement, 2,000 draws, fixed seed); and one of the median of the
pairs' ratios (pairs resampled), the one to read when ``--pool`` mixes machines of different speed;
and how many pairs' ratios are above 1 (a sign test needs no assumption about the spread).
An interval that holds both 0.95 and 1.05 says the run cannot tell a 5 % difference.

Under each table, for the two targeted measures: how far one pass moves from the next on its own.
Two passes of the same target run back to back (A/A, e.g. direct at the end of pass 1 and the
start of pass 2) spread as much as a gateway ÷ direct pair would with no gateway cost at all; the
pairs' own spread then says about how many pairs a 90 % interval of ±1 % or ±5 % would take.

Then, for passes with per-request timestamps (``--probe`` with a traced gateway or ``--trace-vllm``):
the client's send → the server's read (``to_server`` for vLLM direct, ``to_gateway`` for the
gateway), apart for a connection's first request, and the gateway's own stages.

``neighbours`` reads pick_pairs.py's passes run one at a time as pairs the same way.
"""

from __future__ import annotations

import json
import math
import random
import re
import statistics
import sys
from typing import Any

KEYS = (("output_throughput", "tokens/s"), ("median_ttft_ms", "TTFT p50"), ("p99_ttft_ms", "TTFT p99"),
        ("mean_in_flight", "requests in flight"), ("little", "in flight, Little's law"))
_PASS = re.compile(r"-p(\d+)-")


def little(row: dict[str, Any]) -> float:
    """The requests in flight that a pass's own figures imply, for rows from before bench_clients.py
    recorded ``mean_in_flight``: requests/s × mean latency, the latency taken as the mean TTFT plus
    (output tokens per request − 1) × the mean gap between tokens. It reads high (14–38 % above
    ``mean_in_flight`` on results/serve-pairs-h200-k1's rows), so it only compares passes."""
    per_request = row["total_output_tokens"] / row["completed"]
    return float(row["request_throughput"] * (row["mean_ttft_ms"] + (per_request - 1) * row["mean_itl_ms"]) / 1000)


def _boot(a: list[float], b: list[float], rng: random.Random, draws: int = 2000) -> tuple[float, float]:
    ratios = sorted(statistics.median(rng.choices(a, k=len(a))) / statistics.median(rng.choices(b, k=len(b)))
                    for _ in range(draws))
    return ratios[int(0.05 * draws)], ratios[int(0.95 * draws) - 1]


def _boot_pairs(pairs: list[float], rng: random.Random, draws: int = 2000) -> tuple[float, float]:
    """The 90 % interval of the median of the pairs' ratios, pairs resampled: with passes pooled
    from several machines it leaves out how fast each machine was, which the interval of the
    ratio of medians counts as spread."""
    meds = sorted(statistics.median(rng.choices(pairs, k=len(pairs))) for _ in range(draws))
    return meds[int(0.05 * draws)], meds[int(0.95 * draws) - 1]


def boot_mean_ratio(pairs: list[tuple[float, float]], rng: random.Random,
                    draws: int = 2000) -> tuple[float, float, float]:
    """Σ a ÷ Σ b over (a, b) pairs, with its 90 % interval, pairs resampled: where a measure is
    bimodal (vLLM's slow mode at 512) the median of the pairs' ratios reads the common mode and
    leaves out which side lands in the other more often; the ratio of the means counts both."""
    def ratio(ps: list[tuple[float, float]]) -> float:
        return sum(a for a, _ in ps) / sum(b for _, b in ps)
    means = sorted(ratio(rng.choices(pairs, k=len(pairs))) for _ in range(draws))
    return ratio(pairs), means[int(0.05 * draws)], means[int(0.95 * draws) - 1]


def neighbours(rows: list[dict[str, Any]], measures: tuple[tuple[str, str], ...],
               slow_ms: float = 2400.0) -> list[str]:
    """pick_pairs.py's rows, passes 2k and 2k+1 as a pair where one is ``g`` and the other ``d``
    (kinds d,g,g,d: each pair run back to back, a drift over the run falling on both kinds alike):
    per measure (its name, its key in a side's figures) the median of the pairs' g ÷ d (90 %
    bootstrap interval, pairs resampled) and how many are above 1; then the windows in vLLM's slow
    mode (TTFT p50 above ``slow_ms``, as twin_stats.py counts them); then TTFT p50's ratio of the
    means, which counts how often each side was slow, and the pairs' median where neither was."""
    side = {r["pass"]: (r["kind"], next(iter(r["sides"].values()))) for r in rows}
    pairs = [(side[k][1], side[k + 1][1]) if side[k][0] == "g" else (side[k + 1][1], side[k][1])
             for k in sorted(side) if k % 2 == 0 and k + 1 in side and {side[k][0], side[k + 1][0]} == {"g", "d"}]
    if not pairs:
        return []
    rng = random.Random(21)
    lines = ["", f"Neighbouring passes as pairs ({len(pairs)}): gateway ÷ direct", "",
             "| measure | median of the pairs (90 % interval) | above 1 |", "|---|---|---|"]
    for name, key in [*measures, ("request's life mean", "mean_life_ms")]:
        ratios = [g[key] / d[key] for g, d in pairs]
        lo, hi = _boot_pairs(ratios, rng)
        mid, above = statistics.median(ratios), sum(x > 1 for x in ratios)
        lines.append(f"| {name}, g ÷ d | {mid:.3f} ({lo:.3f}–{hi:.3f}) | {above} |")
    slow = [(g["median_ttft_ms"] > slow_ms, d["median_ttft_ms"] > slow_ms) for g, d in pairs]
    lines += ["", f"Slow windows (TTFT p50 above {slow_ms:g} ms): gateway {sum(g for g, _ in slow)}, direct "
              f"{sum(d for _, d in slow)} of {len(pairs)}; in a pair alone: gateway "
              f"{sum(g and not d for g, d in slow)}, direct {sum(d and not g for g, d in slow)}"]
    ttft = [(g["median_ttft_ms"], d["median_ttft_ms"]) for g, d in pairs]
    mean, lo, hi = boot_mean_ratio(ttft, rng)
    fast = [g / d for (g, d), s in zip(ttft, slow, strict=True) if not any(s)]
    lines.append(f"TTFT p50, mean over the pairs, g ÷ d: {mean:.3f} ({lo:.3f}–{hi:.3f}); median of the "
                 f"{len(fast)} pairs with neither slow: " + (f"{statistics.median(fast):.3f}" if fast else "-"))
    return lines


def _by_pass(group: list[dict[str, Any]], target: str, key: str) -> dict[tuple[int, int], float]:
    """``target``'s ``key`` by (file, pass number) (tags "c256-k1-p3-gateway"): a pair is two
    passes of one file, run back to back on one machine."""
    out: dict[tuple[int, int], float] = {}
    for r in group:
        m = _PASS.search(r["tag"])
        value = little(r) if key == "little" else r.get(key)
        if m and r["target"] == target and value is not None:
            out[(r.get("_file", 0), int(m.group(1)))] = value
    return out


def _shape(row: dict[str, Any]) -> str:
    """The load's shape where it was not the closed loop of 128/128 (serve_pairs.py --range-ratio, --rate)."""
    r, q = row.get("range_ratio"), row.get("request_rate")
    return ((f", lengths 128 × [1 ± {r:g}]" if r else "") + (f", Poisson {q:g} requests/s" if q else "")
            + (", CPUs pinned (pin.py)" if row.get("pin") else "")
            + (f", the client on CPUs {row['client_cpus']} of its own" if row.get("client_cpus") else ""))


def _log_sd(values: list[float]) -> str:
    return f"{statistics.stdev(math.log(v) for v in values):.3f}" if len(values) > 1 else "—"


def _needed(pairs: list[float], half: float) -> str:
    """Pairs for a 90 % interval of ±``half`` around the pairs' mean log ratio (normal approximation)."""
    return f"{(1.645 * statistics.stdev(math.log(v) for v in pairs) / half) ** 2:,.0f}" if len(pairs) > 1 else "—"


def noise(group: list[dict[str, Any]]) -> None:
    """A/A: rows adjacent in their file (``_i``, the order they ran in) with one target."""
    at = {(r.get("_file", 0), r["_i"]): r for r in group}
    print("\n| measure | spread of one pass to the next, A/A pairs: sd of log ratio (n) "
          "| gateway ÷ direct pairs: sd (n) | pairs a 90 % interval of ±1 % / ±5 % would take |")
    print("|---|---|---|---|")
    for key, label in KEYS[:2]:
        aa = [r[key] / nxt[key] for (f, i), r in at.items()
              if (nxt := at.get((f, i + 1))) and nxt["target"] == r["target"]]
        gw, base = _by_pass(group, "gateway", key), _by_pass(group, "direct", key)
        pairs = [gw[p] / base[p] for p in gw if p in base]
        print(f"| {label} | {_log_sd(aa)} ({len(aa)}) | {_log_sd(pairs)} ({len(pairs)}) "
              f"| {_needed(pairs, 0.01)} / {_needed(pairs, 0.05)} |")


def ratios(path: str, rows: list[dict[str, Any]]) -> None:
    rng = random.Random(21)
    for conc, k, shape in sorted({(r["conc"], r.get("clients", 1), _shape(r)) for r in rows}):
        group = [r for r in rows if r["conc"] == conc and r.get("clients", 1) == k and _shape(r) == shape]
        targets = sorted({r["target"] for r in group}, key=lambda t: (t != "direct", t))
        print(f"\n{path}: {conc} concurrent, {k} client process(es){shape}\n")
        print("| target | what | median (min–max), n | ÷ direct, medians | 90 % interval | ÷ direct, median of pairs "
              "(n) | 90 % interval, pairs | pairs above 1 |")
        print("|---|---|---|---|---|---|---|---|")
        for t in targets:
            for key, label in KEYS:
                by_pass, base = _by_pass(group, t, key), _by_pass(group, "direct", key)
                vals = list(by_pass.values())
                if not vals:
                    continue
                cell = f"{statistics.median(vals):,.0f} ({min(vals):,.0f}–{max(vals):,.0f}), {len(vals)}"
                if t == "direct" or not base:
                    print(f"| {t} | {label} | {cell} | | | | | |")
                    continue
                pairs = [by_pass[p] / base[p] for p in by_pass if p in base]
                lo, hi = _boot(vals, list(base.values()), rng)
                plo, phi = _boot_pairs(pairs, rng)
                print(f"| {t} | {label} | {cell} | {statistics.median(vals) / statistics.median(base.values()):.2f} "
                      f"| {lo:.2f}–{hi:.2f} | {statistics.median(pairs):.2f} ({len(pairs)}) | {plo:.2f}–{phi:.2f} "
                      f"| {sum(r > 1 for r in pairs)} of {len(pairs)} |")
        noise(group)


def _pq(p: dict[str, Any], k: str) -> str:
    return f"{p[k]['p50']} / {p[k]['p99']} / {p[k]['mean_slowest_1pct']}" if k in p else "—"


def _split(p: dict[str, Any]) -> str:
    new = p.get("to_vllm_new_upstream_connection")
    if "app_to_send" not in p or not new:
        return "—"
    return f"{p['app_to_send']['p99']}; {new['n']} ({new['mean']})"


def phases(rows: list[dict[str, Any]]) -> None:
    traced = [r for r in rows if (r.get("probe") or {}).get("phases", {}).get("joined")]
    if not traced:
        return
    print("\n| pass | client → server read, p50 / mean ms | first request on a connection, mean | reused, mean "
          "| read → app p50 | first chunk → client p50 | app → vLLM read, p50 / p99 / slowest 1 % "
          "| of which app → upstream pool, p99; new upstream connections, n (mean to vLLM read) "
          "| vLLM read → first chunk, p50 / p99 / slowest 1 % | TTFT p50 / p99 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in traced:
        p = r["probe"]["phases"]
        side = "to_server" if "to_server" in p else "to_gateway"
        gw = "read_to_app" in p
        print(f"| {r['tag']} | {p[side]['p50']} / {p[side]['mean']} | {p[side + '_new_connection']['mean']} "
              f"| {p[side + '_reused_connection']['mean']} | {p['read_to_app']['p50'] if gw else '—'} "
              f"| {p['back_to_client']['p50'] if gw else '—'} | {_pq(p, 'to_vllm')} | {_split(p)} "
              f"| {_pq(p, 'in_vllm' if gw else 'in_server')} | {r['median_ttft_ms']:.0f} / {r['p99_ttft_ms']:.0f} |")


def main(args: list[str]) -> None:
    """``--pool``: one table over every file's rows (pairs stay within their file), for one setting
    run on several machines."""
    pool = "--pool" in args
    paths = [a for a in args if a != "--pool"]
    pooled: list[dict[str, Any]] = []
    for i, path in enumerate(paths):
        with open(path) as f:
            rows = [{**r, "_i": n} for n, r in enumerate(json.load(f))]  # the order they ran in
        if pool:
            pooled += [{**r, "_file": i} for r in rows]
            continue
        ratios(path, rows)
        phases(rows)
    if pool:
        ratios(" + ".join(paths), pooled)


if __name__ == "__main__":
    main(sys.argv[1:])
