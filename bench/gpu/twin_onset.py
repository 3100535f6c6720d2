"""When a twin window's vLLM falls into its slow mode: its engine over the pass, fast against slow.

At 512 streams a side a window either runs about 400 of its requests in vLLM's engine or about half,
with TTFT p50 above 2.4 s (twin_stats.py ``--slow-ttft-ms``). Whether the mode is set by the pass's
start (512 requests at once) or grows during the pass decides what could move it: a longer warm-up,
or nothing short of vLLM. This takes each ``gb``/``ga`` side's samples, and those of pick_pairs.py's
``d`` and ``g`` passes (in_pass.py, once a second since t0), in bins of ``--bin`` seconds and gives,
for fast and slow windows apart, the mean over windows of what its vLLM ran in each bin
(in_pass.means), its engine's steps a second and tokens a step, and its API server's share of a CPU
(in_pass.engine). Then, by side, the windows whose vLLM ran fewer than ``--low`` requests over some
bin after the first 10 s (fell), the bin it first did, and how many ran ``--high`` or more again in
a later bin (came back). Last, the fewest requests the engine ran in one sample 5–10 s since t0,
where the streams that all started together end their first requests: by side and by mode.

    python3 bench/gpu/twin_onset.py --conc 512 --slow-ttft-ms 2400 --bin 5 ROWS...
    python3 bench/gpu/twin_onset.py --ramp 10 ROWS...   # pick_pairs.py's passes of one start only
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from in_pass import engine, in_window, instance, means
from twin_stats import gateway_windows, load, ramped
from twin_versus import rank_sum_p_normal

FIGURES = {"running": 0, "steps_per_s": 1, "tokens_per_step": 0, "api_cpu": 2}  # each with its decimals


def binned(rows: list[dict[str, Any]], conc: int, slow_ms: float, width: float,
           end: float) -> dict[bool, list[dict[str, list[float]]]]:
    """For slow (True) and fast windows: per bin [k·width, (k+1)·width) up to ``end`` s since t0,
    each figure's values over the windows that have it."""
    n = int(end // width)
    out: dict[bool, list[dict[str, list[float]]]] = {m: [{f: [] for f in FIGURES} for _ in range(n)]
                                                     for m in (False, True)}
    for r, path, side in gateway_windows(rows, conc):
        samples = r["samples"][instance(path)]
        bins = out[side["median_ttft_ms"] > slow_ms]
        for k in range(n):
            a, b = k * width, (k + 1) * width
            got = {**(means(samples, a, b) or {}), **(engine(samples, a, b) or {})}
            for f in FIGURES:
                if got.get(f) is not None:
                    bins[k][f].append(float(got[f]))
    return out


def falls(rows: list[dict[str, Any]], conc: int, width: float, end: float, low: float,
          high: float) -> dict[str, dict[str, Any]]:
    """By side (gateway, direct): windows, how many fell below ``low`` running in a bin from 10 s
    on, the start of the bin each first did, and how many came back to ``high`` or more."""
    out: dict[str, dict[str, Any]] = {}
    for r, path, _ in gateway_windows(rows, conc):
        samples = r["samples"][instance(path)]
        way = out.setdefault(path.split(":")[0], {"windows": 0, "fell": [], "back": 0})
        way["windows"] += 1
        run = [(means(samples, k * width, (k + 1) * width) or {}).get("running") for k in range(int(end // width))]
        fell = next((k for k in range(int(10 // width), len(run)) if (v := run[k]) is not None and v < low), None)
        if fell is None:
            continue
        way["fell"].append(fell * width)
        way["back"] += any((v := run[k]) is not None and v >= high for k in range(fell + 1, len(run)))
    return out


def first_wave(rows: list[dict[str, Any]], conc: int, slow_ms: float, span: tuple[float, float],
               dip: float = 120) -> list[str]:
    """The fewest requests vLLM's engine ran in any one sample over ``span`` s since t0, where the
    streams that all started at t0 end their first request and start their second: the median by
    side and by mode, each pair of groups with the rank-sum p (normal approximation); then how many
    windows were slow among those whose fewest was ``dip`` or more, and among the others."""
    groups: dict[str, list[float]] = {}
    slow_by_dip: dict[bool, list[bool]] = {True: [], False: []}
    for r, path, side in gateway_windows(rows, conc):
        got = [s[1] for s in in_window(r["samples"][instance(path)], *span)]
        if got:
            fewest, slow = min(got), side["median_ttft_ms"] > slow_ms
            groups.setdefault(path.split(":")[0], []).append(fewest)
            groups.setdefault("slow" if slow else "fast", []).append(fewest)
            slow_by_dip[fewest >= dip].append(slow)
    lines = ["", f"Fewest running in one sample {span[0]:g}–{span[1]:g} s since the start (the first requests' "
             "ends), median (windows)", "", "| group | median | windows | against | rank-sum p |",
             "|---|---|---|---|---|"]
    for a, b in (("gateway", "direct"), ("slow", "fast")):
        if a in groups and b in groups:
            p = rank_sum_p_normal(groups[a], groups[b])
            lines.append(f"| {a} | {statistics.median(groups[a]):g} | {len(groups[a])} | {b} | "
                         f"{f'{p:.3f}' if p >= 0.001 else '< 0.001'} |")
            lines.append(f"| {b} | {statistics.median(groups[b]):g} | {len(groups[b])} | {a} |  |")
    lines += ["", f"Slow among the windows whose fewest was {dip:g} or more: {sum(slow_by_dip[True])} of "
              f"{len(slow_by_dip[True])}; below {dip:g}: {sum(slow_by_dip[False])} of {len(slow_by_dip[False])}"]
    return lines


def table(paths: list[str], conc: int, slow_ms: float, width: float, end: float, low: float = 280,
          high: float = 370, ramp: float | None = None) -> str:
    rows = load(paths)
    if ramp is not None:
        rows = ramped(rows, ramp)
    per = binned(rows, conc, slow_ms, width, end)
    counts = {m: sum((side["median_ttft_ms"] > slow_ms) == m for _, _, side in gateway_windows(rows, conc))
              for m in per}
    lines = [f"vLLM over the pass at {conc} streams, means over {counts[False]} fast and {counts[True]} slow "
             f"windows (TTFT p50 above {slow_ms:g} ms), in bins of {width:g} s since the pass's start\n",
             "| s since start | running: fast / slow | engine steps a second | tokens a step | API server CPU |",
             "|---|---|---|---|---|"]
    for k, (fast, slow) in enumerate(zip(per[False], per[True], strict=True)):
        cells = [" / ".join(f"{statistics.fmean(v):.{digits}f}" if (v := side[f]) else "—" for side in (fast, slow))
                 for f, digits in FIGURES.items()]
        lines.append(f"| {k * width:g}–{(k + 1) * width:g} | " + " | ".join(cells) + " |")
    lines += ["", f"| side | windows | fell below {low:g} running (from 10 s on) | first fell in the bin at, s: "
              f"windows | came back to {high:g} or more |", "|---|---|---|---|---|"]
    for way, f in sorted(falls(rows, conc, width, end, low, high).items()):
        at = ", ".join(f"{t:g}: {f['fell'].count(t)}" for t in sorted(set(f["fell"])))
        lines.append(f"| {way} | {f['windows']} | {len(f['fell'])} | {at or '—'} | {f['back']} |")
    lines += first_wave(rows, conc, slow_ms, (5.0, 10.0))
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", nargs="+")
    ap.add_argument("--conc", type=int, default=512)
    ap.add_argument("--slow-ttft-ms", type=float, default=2400.0)
    ap.add_argument("--bin", type=float, default=5.0, help="seconds a bin")
    ap.add_argument("--end", type=float, default=55.0, help="seconds since the pass's start to cover")
    ap.add_argument("--low", type=float, default=280.0, help="fewer requests running than this: fallen")
    ap.add_argument("--high", type=float, default=370.0, help="this many or more again: came back")
    ap.add_argument("--ramp", type=float, help="only the passes whose streams started over this many s (0: together)")
    a = ap.parse_args(argv)
    print(table(a.rows, a.conc, a.slow_ttft_ms, a.bin, a.end, a.low, a.high, a.ramp))


if __name__ == "__main__":
    main(sys.argv[1:])
