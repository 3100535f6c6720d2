"""vLLM's gauges after cut streams, two API servers, one H200 (bench/gpu/results/cut-gauges-h200):
the write-up's figures against the saved rows of both runs."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest

from tests.support.bench_gpu import RESULTS, load, printed

FOLDER = RESULTS / "cut-gauges-h200"
SHIPPED, STALL = str(FOLDER / "rows.json.gz"), str(FOLDER / "rows-stall.json.gz")
SLEEP, FILES = str(FOLDER / "rows-sleep.json.gz"), str(FOLDER / "rows-files.json.gz")


def _rows(path: str) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as f:
        rows: list[dict[str, Any]] = json.load(f)
    return rows


def _stuck(rows: list[dict[str, Any]]) -> dict[int, float]:
    return {r["trial"]: r["summary"]["stuck_busy"][0] for r in rows if "stuck_busy" in r["summary"]}


def test_the_shipped_gateway_believed_vllms_stuck_gauges() -> None:
    rows = _rows(SHIPPED)
    assert len(rows) == 9 and _stuck(rows) == {0: 15.0, 6: 108.0, 8: 47.0}
    for r in rows:
        s = r["summary"]
        assert r["side"]["errors"] == 0
        if "stuck_busy" in s:
            assert r["kind"] == "d" and s["zero_at_s"] is None and len(s["stuck_busy"]) == 1
            assert s["tokens_moved_while_stuck"] == {"generation": 0.0, "prompt": 0.0}
            assert s["gateway_load_at_end"]["running"] == s["stuck_busy"][0]  # taken as load
            assert s["busy_after_poke_1"] == 0.0  # one request cleared it
        else:
            assert s["zero_at_s"] is not None and s["zero_at_s"] <= 0.8
    assert [s["summary"]["watched_s"] for s in rows if s["trial"] in (0, 6, 8)] == [59.68, 44.56, 44.72]


def test_this_change_flags_them_after_five_seconds_and_never_under_load() -> None:
    rows = _rows(STALL)
    assert len(rows) == 13 and _stuck(rows) == {10: 80.0, 12: 6.0}
    by = {r["trial"]: r["summary"] for r in rows}
    assert (by[10]["gateway_stalled_at_s"], by[12]["gateway_stalled_at_s"]) == (5.15, 5.76)
    assert (by[10]["watched_s"], by[12]["watched_s"]) == (89.47, 89.98)
    assert all(by[n]["gateway_load_at_end"]["stalled"] is True for n in (10, 12))
    assert all(s["gateway_stalled_at_s"] is None for n, s in by.items() if n not in (10, 12))
    under = [x for r in rows for x in r["during_load"]]
    assert len(under) == 261 and not any((x.get("gateway_load") or {}).get("stalled") for x in under)
    assert max(x["busy"] for x in under) == 512.0


def test_the_counts_and_the_write_up() -> None:
    rows = _rows(SHIPPED) + _rows(STALL)
    direct = [r for r in rows if r["kind"] == "d"]
    gateway = [r for r in rows if r["kind"] == "g"]
    assert (len(direct), sum("stuck_busy" in r["summary"] for r in direct)) == (17, 5)
    assert (len(gateway), sum("stuck_busy" in r["summary"] for r in gateway)) == (5, 0)
    text = (FOLDER / "README.md").read_text()
    for quoted in ("5 of 17 direct cuts and 0 of 5", "p = 0.29", "at **5.15 s**", "at **5.76 s**",
                   "none of 261 samples", "0 of 221", "running **108**", "running **80**"):
        assert quoted in text, quoted


def test_the_drain_ended_on_flat_counters_on_the_gpu() -> None:
    rows = _rows(SLEEP)
    assert len(rows) == 26 and _stuck(rows) == {10: 1.0, 13: 29.0}
    assert all(r["kind"] == "d" and r["side"]["errors"] == 0 for r in rows)
    assert [min(r["side"]["output_throughput"] for r in rows), max(r["side"]["output_throughput"] for r in rows)] \
        == [16513.2, 22275.1]
    # The saved summaries are what the raw samples give (the run also wrote left_draining_s, which
    # always equalled asleep_s: the script no longer does).
    summary = load("cut_gauges").summary
    assert all({k: v for k, v in r["summary"].get("sleep", {}).items() if k != "left_draining_s"}
               == summary(r).get("sleep", {}) for r in rows)
    slept = {r["trial"]: r["summary"]["sleep"] for r in rows if "sleep" in r["summary"]}
    assert sorted(slept) == [*range(9), 10, 13]  # after every cut, then only where the gauges stuck
    for n in (10, 13):
        assert slept[n]["busy_at_ask"] == _stuck(rows)[n] and slept[n]["asleep_s"] == 30.26
        assert slept[n]["drain_on_flat_counters"] and slept[n]["running_again_s"] in (0.34, 0.33)
    assert slept[0]["asleep_s"] == 5.04
    others = [slept[n] for n in range(1, 9)]
    assert all(s["busy_at_ask"] == 0 and not s["drain_on_flat_counters"] for s in others)
    assert (min(s["asleep_s"] for s in others), max(s["asleep_s"] for s in others)) == (0.21, 0.34)
    assert (min(s["running_again_s"] for s in [slept[0], *others]),
            max(s["running_again_s"] for s in [slept[0], *others])) == (0.29, 0.36)
    by = {r["trial"]: r["summary"] for r in rows}
    assert (by[10]["gateway_stalled_at_s"], by[13]["gateway_stalled_at_s"]) == (4.61, 4.57)
    # the wake left the gauges stuck: the next trial's samples before its load read them, flagged
    under = [(r["trial"], x) for r in rows for x in r["during_load"]]
    flagged = [(n, x["t"], x["busy"]) for n, x in under if (x.get("gateway_load") or {}).get("stalled")]
    assert len(under) == 516 and len(flagged) == 9
    assert [f for f in flagged if f[2] != 512.0] == [f for f in flagged if f[1] <= 0.26]
    assert [(n, t) for n, t, busy in flagged if busy == 512.0] == [(11, 1.27)]
    late = next(x for n, x in under if n == 11 and x["t"] == 1.27)
    assert late["gateway_load"]["age_s"] == 0.691  # a scrape taken 0.58 s into the load
    every = _rows(SHIPPED) + _rows(STALL) + rows
    direct = [r for r in every if r["kind"] == "d"]
    assert (len(direct), sum("stuck_busy" in r["summary"] for r in direct)) == (43, 7)
    direct += _rows(FILES)  # and with run 4
    assert (len(direct), sum("stuck_busy" in r["summary"] for r in direct)) == (51, 8)
    text = (FOLDER / "README.md").read_text()
    for quoted in ("**30.26 s**", "2 of 26 cuts", "7 of 43 direct cuts", "516 samples", "the gateway flagged 9",
                   "0.21–0.34 s", "0.29–0.36 s", "16.5–22.3 k", "4.61 and 4.57 s"):
        assert quoted in text, quoted


def test_the_stuck_figure_is_one_api_servers_write_made_last() -> None:
    rows = _rows(FILES)
    assert len(rows) == 8 and _stuck(rows) == {3: 12.0}
    assert all(r["side"]["errors"] == 0 for r in rows)
    tps = [r["side"]["output_throughput"] for r in rows]
    assert (min(tps), max(tps)) == (15850.5, 20694.0)
    held = {}  # trial -> (the other API server's figure, its time after API server 1007's 0, s)
    for r in rows:
        run = {f: (v, t) for f, name, v, t in r["gauge_files"] if name == "vllm:num_requests_running"}
        assert sorted(run) == ["gauge_mostrecent_1007.db", "gauge_mostrecent_1008.db"]
        (zero, t0), (v, t1) = run["gauge_mostrecent_1007.db"], run["gauge_mostrecent_1008.db"]
        assert zero == 0.0
        latest = v if t1 > t0 else zero  # prometheus_client's ``mostrecent``
        assert r["after_cut"][-1]["busy"] == latest  # what /metrics said is the value set last
        if v:
            held[r["trial"]] = (v, round(t1 - t0, 4))
    assert held == {0: (6.0, -0.1005), 3: (12.0, 0.0349), 5: (342.0, -0.0002), 6: (30.0, -0.1267),
                    7: (6.0, -2.1854)}
    slept = rows[3]["summary"]["sleep"]
    assert slept["asleep_s"] == 35.62 and slept["drain_on_flat_counters"]
    text = (FOLDER / "README.md").read_text()
    for quoted in ("**12, 35 ms after**", "**342, 0.2 ms before**", "30, 127 ms before", "6, 2.19 s before",
                   "6, 100 ms before", "In 5 of 8 cuts", "35.62 s", "15.9–20.7 k"):
        assert quoted in text, quoted


def test_the_report_prints(capsys: pytest.CaptureFixture[str]) -> None:
    out = printed(capsys, "cut_gauges", ["report", STALL])
    assert "| 10 | direct | not in 89.47 | [80.0] |" in out and "| 5.15 | 0 of 20 |" in out
    out = printed(capsys, "cut_gauges", ["report", SLEEP])
    assert "| 4.61 | 0 of 20 | - | - | 30.26 (drained on flat counters) |" in out
