"""bench/gpu/pick_pairs.py's table against its committed run (results/pick-api2-h200), and the
switchable pick that run alternated (gateway_variant.py ``--variant switch``)."""

from __future__ import annotations

import gzip
import json
import random
from types import SimpleNamespace
from typing import Any

from gateway.upstream import Origin
from tests.support.bench_gpu import RESULTS, load

pick_pairs = load("pick_pairs")
variant = load("gateway_variant")


def _rows() -> list[dict[str, Any]]:
    with gzip.open(RESULTS / "pick-api2-h200" / "rows.json.gz", "rt") as f:
        rows: list[dict[str, Any]] = json.load(f)
    return rows


def test_report_reads_the_committed_run() -> None:
    rows = _rows()
    assert [r["kind"] for r in rows].count("g") == 7 and [r["kind"] for r in rows].count("r") == 6
    table = pick_pairs.report(rows).splitlines()
    by = {line.split(" | ")[0].strip("| "): line for line in table if line.startswith("| ")}
    # the share of first tokens later than 1.2 s: shipped pick, random pick, direct
    assert "| 0.0% (0.0%–1.0%) |" in by["gateway"]
    assert "| 2.9% (0.9%–13.5%) |" in by["random"]
    assert "| 0.9% (0.0%–2.7%) |" in by["direct"]
    assert by["TTFT p99 ms"].endswith("| 0.534, p = 0.002 |")  # shipped ÷ random
    assert "| 0.000, p = 0.002 |" in by["TTFT > 1200 ms"]


def _origin() -> Any:
    origin = Origin("http://127.0.0.1:9")
    origin.idle = {101: [SimpleNamespace(closed=False, server=101, n=i) for i in range(4)],
                   202: [SimpleNamespace(closed=False, server=202, n=i) for i in range(4, 8)]}
    origin.up = {101: 6, 202: 4}  # 2 busy on 101, none on 202
    return origin


def test_switch_picks_at_random_after_sigusr1_and_as_shipped_after_sigusr2() -> None:
    random.seed(7)
    variant._set(True)
    seen = set()
    for _ in range(200):
        origin = _origin()
        seen.add(variant._switch(origin).n)
        assert sum(map(len, origin.idle.values())) == 7  # one taken, the rest still idle
    assert seen == set(range(8))  # any idle connection, on either process, at any age
    variant._set(False)
    origin = _origin()
    assert variant._switch(origin).n == 7  # shipped: the newest on the process with fewer busy (202)
    assert variant._switch(origin).n == 6
