"""Two replicas on one H200, one left with vLLM's stuck gauges (bench/gpu/results/cut-pair-h200):
the write-up's figures against the saved rows."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest

from tests.support.bench_gpu import RESULTS, load, printed

FOLDER = RESULTS / "cut-pair-h200"
ROWS = str(FOLDER / "rows.json.gz")
STUCK = {3: 196.0, 6: 224.0, 13: 37.0, 19: 134.0, 24: 82.0, 25: 92.0, 29: 192.0, 36: 23.0}


def _rows() -> list[dict[str, Any]]:
    with gzip.open(ROWS, "rt") as f:
        rows: list[dict[str, Any]] = json.load(f)
    return rows


def test_the_cuts_and_which_stuck() -> None:
    rows = _rows()
    assert len(rows) == 37 and all(r["kind"] == "d" and r["side"]["errors"] == 0 for r in rows)
    tps = [r["side"]["output_throughput"] for r in rows]
    assert (min(tps), max(tps)) == (14321.1, 19975.9)
    stuck = {r["trial"]: r["summary"]["stuck_busy"][0] for r in rows if "stuck_busy" in r["summary"]}
    assert stuck == STUCK and sorted(r["trial"] for r in rows if "on_stuck" in r) == sorted(STUCK)
    for r in rows:
        if r["trial"] in STUCK:
            assert r["summary"]["tokens_moved_while_stuck"] == {"generation": 0.0, "prompt": 0.0}
        assert not r["before"].get("busy")  # every trial began with a's gauges at 0
    under = [x for r in rows for x in r["during_load"]]
    assert len(under) == 435 and not any((x.get("gateway_load") or {}).get("stalled") for x in under)


def test_routing_the_metric_and_the_restarts() -> None:
    rows = _rows()
    summary = load("cut_pair").summary
    got = {r["trial"]: summary(r) for r in rows if "on_stuck" in r}
    assert {n: s["flagged_after_cut_s"] for n, s in got.items()} == {
        3: 5.2, 6: 5.17, 13: 5.2, 19: 5.14, 24: 4.77, 25: 6.44, 29: 5.42, 36: 4.68}
    assert all(s["metric_flagged"] == {"a": 1.0, "b": 0.0} for s in got.values())
    routed = [n for n, s in got.items() if s["step"] == "route"]
    assert routed == [3, 13, 19, 24, 29, 36]
    for n in routed:
        s = got[n]
        assert s["requests_to"] == {"a": 8, "b": 8} and s["statuses"] == [200] and s["busy_after_requests"] == 0
        assert [b for b, _ in rows[n]["on_stuck"]["requests"]] == ["a", "b"] * 8  # a first, then in turn
        assert 0.03 <= s["metric_zero_after_s"] <= 0.05
        took = rows[n]["on_stuck"]["after_requests"]["t"] - rows[n]["on_stuck"]["at_ask"]["t"]
        assert 1.0 <= round(took, 1) <= 1.4
    sent = [code for r in rows if "requests" in r.get("on_stuck", {}) for _, code in r["on_stuck"]["requests"]]
    assert len(sent) == 96 and set(sent) == {200}
    restarts = {n: s for n, s in got.items() if s["step"] == "restart"}
    assert {n: (s["drained_after_s"], s["running_after_s"]) for n, s in restarts.items()} == {
        6: (30.12, 105.92), 25: (30.11, 103.66)}
    assert all(s["drain_on_flat_counters"] for s in restarts.values())
    for n in restarts:
        states = rows[n]["on_stuck"]["restart"]["states"]
        assert [st for st, _ in states] == ["DRAINING", "STOPPING", "STARTING", "RUNNING"]
        assert 2.2 <= states[2][1] - states[1][1] <= 2.6


def test_the_write_up_quotes_them(capsys: pytest.CaptureFixture[str]) -> None:
    text = (FOLDER / "README.md").read_text()
    for quoted in ("**8 of 37**", "running 23–224", "14.3–20.0 k", "4.68–6.44 s", "435 samples", "**30.12**",
                   "**30.11**", "103.66", "105.92", "16 of 88 direct cuts", "8 of 51 there", "0.03–0.05 s",
                   "All 96 requests answered"):
        assert quoted in text, quoted
    out = printed(capsys, "cut_pair", ["report", ROWS])
    assert out.startswith("37 cuts, 8 left a's gauges above 0")
    assert "| 6 | 224 | 5.17 | {'a': 1.0, 'b': 0.0} | restart | - | - | - | 30.12 (flat counters) | 105.92 |" in out
    assert "| 36 | 23 | 4.68 | {'a': 1.0, 'b': 0.0} | route | 8 / 8 | 0.0 | 0.03 |" in out
