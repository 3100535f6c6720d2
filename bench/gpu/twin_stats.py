"""twin_pairs.py's rows as gateway ÷ direct ratios with their intervals, and how noisy each design is.

    python3 bench/gpu/twin_stats.py W/rows.json [more rows.json or rows.json.gz ...]

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
- with each second's tokens and TTFTs in the rows (window_client.py since 2026-11-26): every
  pass's ratio over sub-windows of T seconds, around that pass's own ratio. A spread that falls as
  1/√T (× √T constant) is noise a longer window averages out; then a whole window's ratio should
  spread by the last T's figure × √(T / window). Swap pairs that spread more than that, pass to
  pass, have a part that belongs to the pass, which only more passes average out.

With ``--slow-ttft-ms MS``, also each pass sorted by which side's TTFT p50 was above MS (twin_modes.py):

    python3 bench/gpu/twin_stats.py [--slow-ttft-ms 2400] W/rows.json [more ...]
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import math
import random
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from in_pass import in_window, instance
from pair_stats import _boot_pairs, _log_sd, _needed
from twin_modes import modes_table

KEYS = (("output_throughput", "tokens/s"), ("median_ttft_ms", "TTFT p50"), ("p99_ttft_ms", "TTFT p99"),
        ("mean_ttft_ms", "TTFT mean"), ("median_head_ms", "response head p50"),
        ("mean_itl_ms", "mean gap between tokens"), ("mean_life_ms", "request's life mean"),
        ("mean_in_flight", "requests in flight"))
# the kinds of pass whose ratios pair up, by what the second side does: ``aa`` has none to pair
FAMILIES = {"gateway": ("gb", "ga", "aa"), "jitter": ("jb", "ja")}


def _paths(row: dict[str, Any]) -> tuple[str | None, str | None]:
    """A pass's two sides' paths as the ratio takes them: gateway (or jittered) ÷ direct, for ``aa``
    b ÷ a."""
    if row["kind"] == "aa":
        return "direct:b", "direct:a"
    s = row["sides"]
    return (next((p for p in s if not p.startswith("direct")), None),
            next((p for p in s if p.startswith("direct")), None))


def _num_den(row: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A pass's two sides as the ratio takes them (``_paths``)."""
    num, den = _paths(row)
    return row["sides"].get(num, {}), row["sides"].get(den, {})


def pass_ratio(row: dict[str, Any], key: str) -> float | None:
    """A ``gb``/``ga`` pass's gateway side ÷ its direct side (``jb``/``ja``: the jittered side's),
    an ``aa`` pass's b ÷ a."""
    num, den = (side.get(key) for side in _num_den(row))
    return num / den if num and den else None


def swap_pairs(rows: list[dict[str, Any]], key: str) -> list[float]:
    """Each ``gb`` with the ``ga`` that follows or precedes it in run order, one pass in one pair
    (``jb`` with ``ja`` alike: give it one family's rows), never two passes of different runs
    (``main`` marks each row's file)."""
    out, held = [], None
    for r in rows:
        if r["kind"] == "aa" or (ratio := pass_ratio(r, key)) is None:
            continue
        if held is not None and held[0] != r["kind"] and held[2] == r.get("_file"):
            out.append(math.sqrt(held[1] * ratio))
            held = None
        else:
            held = (r["kind"], ratio, r.get("_file"))
    return out


def sequential(rows: list[dict[str, Any]], key: str) -> list[float]:
    """One instance's direct side ÷ its direct side in the next pass it was served direct in."""
    out = []
    for inst in ("a", "b"):
        series = [v for r in rows if (v := r["sides"].get(f"direct:{inst}", {}).get(key))]
        out += [b / a for a, b in itertools.pairwise(series)]
    return out


PIECES = (1, 2, 3, 4, 6, 8, 12, 24, 30, 40, 60)  # sub-window lengths tried, those that divide the window
# measure -> (what each side keeps per second, how one piece's seconds make its figure, the
# whole window's figure that swap pairs compare)
BY_SECOND: dict[str, tuple[str, Callable[[list[Any]], float], str]] = {
    "tokens/s": ("tokens_each_second", sum, "output_throughput"),
    "TTFT p50": ("ttft_ms_each_second",
                 lambda secs: statistics.median(ms) if (ms := [*itertools.chain(*secs)]) else 0, "median_ttft_ms"),
}


def piece_ratios(row: dict[str, Any], t: int, measure: str) -> list[float]:
    """The pass's ratio over each ``t``-second piece of its window, by each second's figures."""
    field, fold, _ = BY_SECOND[measure]
    num, den = (side.get(field) for side in _num_den(row))
    if not num or not den or len(num) != len(den) or len(num) % t:
        return []
    out = []
    for i in range(0, len(num), t):
        n, d = fold(num[i:i + t]), fold(den[i:i + t])
        if n > 0 and d > 0:
            out.append(n / d)
    return out


def sub_windows(rows: list[dict[str, Any]], measure: str) -> dict[int, tuple[float, int]]:
    """T -> (the spread of a pass's ratio over T-second pieces around that pass's own mean, pooled
    over passes as an sd of log ratios; how many pieces). Each pass's own level (the gateway's
    effect, one GPU against the other) drops out: what is left is how far a T-second measurement
    of one pass strays from the pass's own answer."""
    out: dict[int, tuple[float, int]] = {}
    for t in PIECES:
        squares, pieces, passes = 0.0, 0, 0
        for r in rows:
            logs = [math.log(x) for x in piece_ratios(r, t, measure)]
            if len(logs) > 1:
                mean = statistics.fmean(logs)
                squares += sum((x - mean) ** 2 for x in logs)
                pieces, passes = pieces + len(logs), passes + 1
        if pieces > passes:
            out[t] = (math.sqrt(squares / (pieces - passes)), pieces)
    return out


def waves(per_second: list[int]) -> tuple[float, float, int, float] | None:
    """One side's tokens each second: (coefficient of variation, busiest second ÷ the mean, the lag
    in s, 2–15, where their autocorrelation peaks, and its value there). With the tiny model the
    load moves in waves of one request's life (6–10 s at 512 streams, results/twin-long-h200x2),
    whether the streams start together or not (results/twin-waves-h200x2); a steady load shows no
    peak to speak of."""
    xs = per_second
    if len(xs) < 32 or not (mean := statistics.fmean(xs)):
        return None
    dev = [x - mean for x in xs]
    var = sum(d * d for d in dev) / len(xs)
    if not var:
        return 0.0, 1.0, 0, 0.0
    auto = {k: statistics.fmean(dev[i] * dev[i + k] for i in range(len(xs) - k)) / var for k in range(2, 16)}
    # the shortest of the lags near the peak: a period's multiples correlate about as well
    lag = min(k for k, v in auto.items() if v >= 0.9 * max(auto.values()))
    return math.sqrt(var) / mean, max(xs) / mean, lag, auto[lag]


def _waves_line(group: list[dict[str, Any]]) -> list[str]:
    each = [w for r in group for side in r["sides"].values() if (w := waves(side.get("tokens_each_second") or []))]
    if not each:
        return []
    cv, top, lag, auto = zip(*each, strict=True)
    return [f"\nEach second's tokens, every side ({len(each)}): cv {min(cv):.2f}–{max(cv):.2f}, busiest second "
            f"{min(top):.1f}–{max(top):.1f}× the mean, autocorrelation peaks at a lag of {min(lag)}–{max(lag)} s "
            f"({min(auto):.2f}–{max(auto):.2f})."]


def _side_ratio(r: dict[str, Any], values: dict[str, float]) -> tuple[float, str] | None:
    """One pass's ``values`` as its ratio takes them (``_paths``), with the ratio's label."""
    num, den = _paths(r)
    if num not in values or den not in values:
        return None
    return values[num] / values[den], "b ÷ a" if r["kind"] == "aa" else f"{str(num).split(':')[0]} ÷ direct"


def _ratio_line(what: str, ratios: list[tuple[float, str]]) -> list[str]:
    if not ratios:
        return []
    xs = [x for x, _ in ratios]
    return [f"\n{what}, {ratios[-1][1]}, each pass: {', '.join(f'{x:.3f}' for x in xs)} "
            f"(median {statistics.median(xs):.3f})."]


def _engine_table(group: list[dict[str, Any]]) -> list[str]:
    """Passes with in_pass.py's samples: how many of each side's streams its vLLM engine ran over
    the window (mean, fewest, most), how many waited in its scheduler, and the gateway's busy
    connections to it. A closed loop keeps ``conc`` in flight; the rest are in vLLM's HTTP server
    (before the engine took them, or after it finished them), or in the gateway.

    Then, per pass, the tokens/s each request running in the engine got (tokens/s ÷ the mean
    running: about the engine's decode steps per second, as a running request gets a token a step),
    one side's ÷ the other's: whether a side's engine stepped slower with as many requests on it."""
    lines: list[str] = []
    ratios: list[tuple[float, str]] = []
    for r in group:
        t = r.get("timing")
        if "samples" not in r or not t:
            continue
        per_running = {}
        for path, side in r["sides"].items():
            w = in_window(r["samples"].get(instance(path), []), t["warmup"], t["warmup"] + t["window"])
            if not w:
                continue
            running, waiting = [q[1] for q in w], [q[2] for q in w]
            busy = statistics.fmean(q[3] - q[4] for q in w)
            lines.append(f"| {r['pass']} | {r['kind']} | {path} | {side.get('median_ttft_ms')} | "
                         f"{side.get('output_throughput')} | {statistics.fmean(running):.0f} ({min(running):.0f}–"
                         f"{max(running):.0f}) | {statistics.fmean(waiting):.0f} | {busy:.0f} |")
            if side.get("output_throughput") and statistics.fmean(running) > 0:
                per_running[path] = side["output_throughput"] / statistics.fmean(running)
        if (ratio := _side_ratio(r, per_running)) is not None:
            ratios.append(ratio)
    if not lines:
        return []
    return ["\nIn each side's vLLM over the window, sampled each second (in_pass.py):\n",
            "| pass | kind | side | TTFT p50, ms | tokens/s | running in its engine: mean (fewest–most) "
            "| waiting in its scheduler | gateway connections busy |", "|---|---|---|---|---|---|---|---|", *lines,
            *_ratio_line("Tokens/s per request running in the engine", ratios)]


def _steps_table(group: list[dict[str, Any]]) -> list[str]:
    """Passes with in_pass.engine's figures: each side's engine steps a second and tokens a step,
    vLLM's own mean gap between a request's tokens, and the CPU its API server and its engine core
    (with any workers) used; then the steps a second, one side's ÷ the other's, each pass."""
    lines: list[str] = []
    ratios: list[tuple[float, str]] = []
    for r in group:
        eng = r.get("engine") or {}
        steps = {}
        for path in r["sides"]:
            e = eng.get(path)
            if not e:
                continue
            itl = ((r.get("vllm_clock") or {}).get(path) or {}).get("vllm_itl_ms")
            lines.append(f"| {r['pass']} | {r['kind']} | {path} | {e['steps_per_s']} | {e['tokens_per_step']} | "
                         f"{itl} | {e['api_cpu']} | {e['engine_cpu']} |")
            if e["steps_per_s"]:
                steps[path] = e["steps_per_s"]
        if (ratio := _side_ratio(r, steps)) is not None:
            ratios.append(ratio)
    if not lines:
        return []
    return ["\nEach side's vLLM engine and processes over the window (in_pass.engine; CPU in cores):\n",
            "| pass | kind | side | engine steps/s | tokens a step | vLLM's gap between tokens, ms "
            "| API server CPU | engine core CPU |", "|---|---|---|---|---|---|---|---|", *lines,
            *_ratio_line("Engine steps a second", ratios)]


def _host_table(group: list[dict[str, Any]]) -> list[str]:
    """Passes with in_pass.engine's run delay and GPU figures: per side, the CPU its engine core
    (and any workers) used and the share of a CPU its threads spent waiting for one, the same for
    its API server, its GPU's busy %, SM clock and power, and the GPU's busy ms per engine step.
    A CPU-bound engine that waits for a CPU, or whose GPU sits idle between its kernels, steps
    slower for want of CPU; one whose GPU is busy throughout steps at the GPU's pace."""
    lines: list[str] = []
    for r in group:
        for path in r["sides"]:
            e = (r.get("engine") or {}).get(path) or {}
            if e.get("engine_wait") is None or e.get("gpu_busy_pct") is None:
                continue
            busy_ms = (f"{e['gpu_busy_pct'] * 10 / e['steps_per_s']:.1f}" if e.get("steps_per_s") else "—")
            where = (r.get("pin") or {}).get(instance(path), {}).get("cpu", "—")
            lines.append(f"| {r['pass']} | {r['kind']} | {where} | {path} | {e['engine_cpu']} | {e['engine_wait']} | "
                         f"{e['api_cpu']} | {e['api_wait']} | {e['gpu_busy_pct']} | {e['sm_mhz']:.0f} | "
                         f"{e['power_w']:.0f} | {busy_ms} |")
    if not lines:
        return []
    return ["\nEach side's CPU and GPU over the window (in_pass.engine; CPU and waiting in cores):\n",
            "| pass | kind | engine loop pinned to CPU | side | engine core CPU | engine core waiting for a CPU "
            "| API server CPU | API server waiting | GPU busy, % | SM clock, MHz | GPU power, W "
            "| GPU busy ms a step |", "|---|---|---|---|---|---|---|---|---|---|---|---|", *lines]


def _clock_table(group: list[dict[str, Any]]) -> list[str]:
    """Passes with vLLM's clocks (in_pass.vllm_means): each side's mean TTFT and request life as
    its client measured them, beside vLLM's own, which start when its handler renders the prompt;
    the difference is time in the gateway, on the sockets and in vLLM's HTTP server before the
    handler and after the output processor. The response head comes once the handler has
    tokenized the request and returned the stream."""
    lines, outside, ratios, label = [], [], [], ""
    for r in group:
        each = {}  # path -> (the client's mean TTFT, vLLM's)
        for path, side in r["sides"].items():
            clock = (r.get("vllm_clock") or {}).get(path) or {}
            ttft, head, life = (side.get(f"mean_{k}_ms") for k in ("ttft", "head", "life"))
            v_ttft, queue, e2e = (clock.get(f"vllm_{k}_ms") for k in ("ttft", "queue", "e2e"))
            if ttft is None or head is None or life is None or v_ttft is None or queue is None or e2e is None:
                continue
            each[path] = (ttft, v_ttft)
            lines.append(f"| {r['pass']} | {r['kind']} | {path} | {ttft:.0f} | {head:.0f} | {v_ttft:.0f} | {queue:.0f} "
                         f"| {ttft - v_ttft:.0f} | {life:.0f} | {e2e:.0f} | {life - e2e:.0f} |")
        num, den = _paths(r)
        if r["kind"] != "aa" and num and den and {num, den} <= each.keys():
            (n, n_v), (d, d_v) = each[num], each[den]
            outside.append((n - n_v) - (d - d_v))
            ratios.append(f"{n_v / d_v:.3f} / {n / d:.3f}")
            label = num.split(":")[0]
    if not lines:
        return []
    summary = [f"\nTTFT outside vLLM's clock, the {label} side's − the direct side's, each pass: "
               f"{', '.join(f'{x:+.0f}' for x in outside)} ms (median {statistics.median(outside):+.0f}); "
               f"mean TTFT {label} ÷ direct, vLLM's / the client's, each pass: {', '.join(ratios)}."] if outside else []
    return ["\nMeans in ms, by the client and by vLLM's clocks (in_pass.py):\n",
            "| pass | kind | side | TTFT | response head | vLLM's TTFT | vLLM's queue | TTFT outside vLLM's "
            "| request's life | vLLM's e2e | life outside vLLM's |", "|---|---|---|---|---|---|---|---|---|---|---|",
            *lines, *summary]


def _sub_table(group: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    for measure, (field, _, whole) in BY_SECOND.items():
        subs = sub_windows(group, measure)
        if not subs:
            continue
        window = max(len(_num_den(r)[0].get(field) or []) for r in group)
        last = max(subs)
        pairs = swap_pairs(group, whole)
        one = f"{statistics.stdev(map(math.log, pairs)) * math.sqrt(2):.3f}" if len(pairs) > 1 else "—"
        lines += [f"\n{measure}, each pass's ratio over sub-windows of T s, around the pass's own ratio:\n",
                  "| T, s | " + " | ".join(map(str, subs)) + " |", "|---|" + "---|" * len(subs),
                  "| sd of log ratio (pieces) | " + " | ".join(f"{sd:.3f} ({n})" for sd, n in subs.values()) + " |",
                  "| sd × √T | " + " | ".join(f"{sd * math.sqrt(t):.3f}" for t, (sd, _) in subs.items()) + " |",
                  f"\nIf the {window} s window's pieces were independent, a pass's ratio would spread by "
                  f"{subs[last][0] * math.sqrt(last / window):.3f} (from T = {last} s); "
                  f"swap pairs' sd × √2, one pass's share: "
                  f"{one} ({len(pairs)} pairs)."]
    return lines


def _heading(conc: int, family: str, group: list[dict[str, Any]]) -> list[str]:
    kinds = FAMILIES[family]
    # what marks this group out (variant()), said after the pass counts
    marks = ", each engine core loop on a CPU of its own" if group[0].get("pin") else ""
    if idle := group[0].get("direct_idle"):
        by = " by a process of their own" if group[0].get("idle_by") == "holder" else ""
        marks += f", each direct side holding {idle:,} idle connections{by}"
    n = {k: sum(1 for r in group if r["kind"] == k) for k in kinds}
    if family == "gateway":
        title = (f"{conc:,} streams per side ({n['gb']} gb, {n['ga']} ga, {n['aa']} aa passes; "
                 f"{sum(r.get('queued', 0) for r in group)} requests queued in the gateway{marks})")
        label = "gateway"
    else:
        jitter = sorted({r.get("jitter_ms") for r in group})
        title = (f"{conc:,} streams per side, direct both, one pausing 0–{'/'.join(map(str, jitter))} ms before "
                 f"each request ({n['jb']} jb, {n['ja']} ja passes{marks})")
        label = "jittered"
    return [f"\n### {title}\n",
            f"| measure | {label} ÷ direct, median of swap pairs (90 % interval), above 1 | passes {kinds[0]} / "
            f"{kinds[1]} | sd: swap pairs (n) | sd: aa, b ÷ a at once (n) | sd: one instance, pass to pass (n) "
            "| swap pairs for ±1 % / ±5 % |"]


def variant(row: dict[str, Any]) -> tuple[bool, int, str]:
    """What a pass was run with besides its kind: the engines apart, idle connections on the direct
    side, and who held them ("client", "holder"; "" for none)."""
    idle = row.get("direct_idle", 0)
    return bool(row.get("pin")), idle, row.get("idle_by", "client") if idle else ""


def report(rows: list[dict[str, Any]], slow_ms: float | None = None) -> str:
    lines = []
    rng = random.Random(21)
    # passes with the engines apart (twin_pairs.py's gbp, gap) or idle connections held at the direct
    # side (gbi, gai; gbh, gah) pair and report among themselves
    variants = sorted({variant(r) for r in rows})
    for conc, (family, kinds), v in itertools.product(sorted({r["conc"] for r in rows}), FAMILIES.items(),
                                                            variants):
        group = [r for r in rows if r["conc"] == conc and r["kind"] in kinds and variant(r) == v]
        if not group:
            continue
        lines += [*_heading(conc, family, group), "|---|---|---|---|---|---|---|"]
        for key, label in KEYS:
            if not any(key in side for r in group for side in r["sides"].values()):
                continue  # rows from before the client measured it
            pairs = swap_pairs(group, key)
            by_kind = {k: [f"{v:.3f}" for r in group if r["kind"] == k and (v := pass_ratio(r, key))]
                       for k in kinds[:2]}
            aa = [v for r in group if r["kind"] == "aa" and (v := pass_ratio(r, key))]
            seq = sequential(group, key)
            if pairs:
                lo, hi = _boot_pairs(pairs, rng) if len(pairs) > 1 else (pairs[0], pairs[0])
                mid = (f"{statistics.median(pairs):.3f} ({lo:.3f}–{hi:.3f}), "
                       f"{sum(p > 1 for p in pairs)} of {len(pairs)}")
            else:
                mid = "—"
            lines.append(f"| {label} | {mid} | {' / '.join(' '.join(v) or '—' for v in by_kind.values())} "
                         f"| {_log_sd(pairs)} ({len(pairs)}) | {_log_sd(aa)} ({len(aa)}) | {_log_sd(seq)} ({len(seq)}) "
                         f"| {_needed(pairs, 0.01)} / {_needed(pairs, 0.05)} |")
        cpu = [r["gateway_cpu_share"] for r in group if r["kind"] in ("gb", "ga") and "gateway_cpu_share" in r]
        client = [s["client_cpu_share"] for r in group for s in r["sides"].values() if "client_cpu_share" in s]
        if cpu and client:
            lines.append(f"\nGateway CPU over a pass: {min(cpu):.2f}–{max(cpu):.2f} of a core; each client over "
                         f"its window: {min(client):.2f}–{max(client):.2f}.")
        lines += (_waves_line(group) + _engine_table(group) + _steps_table(group) + _host_table(group)
                  + _clock_table(group) + _sub_table(group))
        if slow_ms is not None and family == "gateway":
            lines += modes_table(group, slow_ms)
    return "\n".join(lines)


def gateway_windows(rows: list[dict[str, Any]], conc: int) -> Iterator[tuple[dict[str, Any], str, dict[str, Any]]]:
    """Each side of every ``gb``/``ga`` pass at ``conc``, and of pick_pairs.py's ``d`` and ``g``
    passes (one side each): (its pass, its path, its client's figures)."""
    for r in rows:
        if r["conc"] == conc and r["kind"] in ("gb", "ga", "d", "g"):
            for path, side in r["sides"].items():
                yield r, path, side


def load(paths: list[str]) -> list[dict[str, Any]]:
    """The rows of several runs, each marked with its file (``_file``): they pool their swap pairs,
    each pair within one file. A long run's rows (each request's TTFT) are kept gzipped in results/."""
    return [{**r, "_file": i} for i, p in enumerate(paths)
            for r in json.loads(gzip.decompress(Path(p).read_bytes()) if p.endswith(".gz") else Path(p).read_text())]


def ramped(rows: list[dict[str, Any]], ramp: float) -> list[dict[str, Any]]:
    """The rows of pick_pairs.py's passes whose streams started over ``ramp`` s (0: together)."""
    return [r for r in rows if r.get("timing", {}).get("ramp", 0.0) == ramp]


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", nargs="+")
    ap.add_argument("--slow-ttft-ms", type=float, help="also sort passes by which side's TTFT p50 was above this")
    a = ap.parse_args(argv)
    print(report(load(a.rows), a.slow_ttft_ms))


if __name__ == "__main__":
    main(sys.argv[1:])
