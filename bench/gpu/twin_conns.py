"""Twin windows in vLLM's slow mode, by how many connections their vLLM held.

At 512 streams a side, a window either ran most of its requests in vLLM's engine or about half,
with TTFT p50 above 2.4 s (twin_stats.py ``--slow-ttft-ms``). If idle connections pushed vLLM's API
server into the slow mode, windows whose vLLM held more connections would fall into it more often.
A window's vLLM held the gateway's warm pool to that instance (``in_vllm``'s ``conns_open``, the
gateway's ``/fleet`` each second: the pool reaches every instance, the one the direct client loads
as well), and on the direct side the client's own streams and the idle connections it held
(``twin_pairs.py``'s ``gbi``/``gai``, ``idle_held``), or a process of their own held them
(``gbh``/``gah``: counted apart). Counts are rounded to 256.

    python3 bench/gpu/twin_conns.py --conc 512 --slow-ttft-ms 2400 ROWS...
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path
from typing import Any

from twin_modes import fisher_p
from twin_stats import gateway_windows, load

_APART = " in another process"  # twin_pairs.py's gbh/gah: a process of their own held the idle ones


def windows(rows: list[dict[str, Any]], conc: int, slow_ms: float) -> list[tuple[int, str, int, bool]]:
    """Each ``gb``/``ga`` window at ``conc``: (its file, its side: gateway, direct or direct holding
    idle connections, its vLLM's connections rounded to 256, whether it was slow)."""
    out = []
    for r, path, side in gateway_windows(rows, conc):
        way = path.split(":")[0]
        pool = r["in_vllm"][path]["conns_open"]
        held = pool + (conc + side.get("idle_held", 0) if way == "direct" else 0)
        if side.get("idle_held"):
            way += " holding idle ones" + (_APART if r.get("idle_by") == "holder" else "")
        out.append((r["_file"], way, 256 * round(held / 256), side["median_ttft_ms"] > slow_ms))
    return out


def table(paths: list[str], conc: int, slow_ms: float) -> str:
    ws = windows(load(paths), conc, slow_ms)
    per: dict[tuple[int, str, int], list[bool]] = collections.defaultdict(list)
    pooled: dict[tuple[int, bool], list[bool]] = collections.defaultdict(list)  # by count, and held apart
    sides: dict[str, list[bool]] = collections.defaultdict(list)
    for f, way, held, slow in ws:
        per[(f, way, held)].append(slow)
        pooled[(held, way.endswith(_APART))].append(slow)
        sides[way].append(slow)
    lines = [f"Windows at {conc} streams with TTFT p50 above {slow_ms:g} ms, by the connections their vLLM held\n",
             "| run | side | connections | slow windows |", "|---|---|---|---|"]
    lines += [f"| {Path(paths[f]).parent.name}/{Path(paths[f]).name} | {way} | {held:,} | {sum(s)} of {len(s)} |"
              for (f, way, held), s in sorted(per.items())]
    lines += ["", "| connections | slow windows, all runs | against every other window: Fisher p |", "|---|---|---|"]
    total, n = sum(s for _, _, _, s in ws), len(ws)
    for (held, apart), s in sorted(pooled.items()):
        a, m = sum(s), len(s)
        p = _p(fisher_p(a, m, total - a, n - m)) if m < n else "—"
        lines.append(f"| {held:,}{' (idle ones' + _APART + ')' if apart else ''} | {a} of {m} ({a / m:.0%}) | {p} |")
    lines += ["", "| side | slow windows, all runs |", "|---|---|"]
    lines += [f"| {way} | {sum(s)} of {len(s)} ({sum(s) / len(s):.0%}) |" for way, s in sorted(sides.items())]
    if (g := sides.get("gateway")) and (d := sides.get("direct")):
        lines.append(f"\nGateway side against direct side (no idle connections held): Fisher p = "
                     f"{_p(fisher_p(sum(g), len(g), sum(d), len(d)))}.")
    return "\n".join(lines)


def _p(p: float) -> str:
    return f"{p:.2f}" if p >= 0.01 else f"{p:.3f}"


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", nargs="+")
    ap.add_argument("--conc", type=int, default=512)
    ap.add_argument("--slow-ttft-ms", type=float, default=2400.0)
    a = ap.parse_args(argv)
    print(table(a.rows, a.conc, a.slow_ttft_ms))


if __name__ == "__main__":
    main(sys.argv[1:])
