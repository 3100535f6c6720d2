"""The twin passes whose direct side's idle connections a process of their own held
(bench/gpu/results/twin-holder-h200x2): twin_conns.py and twin_versus.py keep them apart from those
the client held, and the write-up's quoted figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.bench_gpu import DEFAULTS_512, HOLDER, IDLE, POOL512, conns_pass, printed
from tests.support.bench_gpu import load as _load


def test_conns_count_held_apart_windows_on_their_own() -> None:
    conns = _load("twin_conns")
    rows = [{**conns_pass("gb", (1, 1000), (1, 3000), idle=512), "_file": 0},
            {**conns_pass("ga", (1, 1000), (1, 1000), idle=512), "idle_by": "holder", "_file": 0}]
    assert [w[1:] for w in conns.windows(rows, 512, 2400)] == [
        ("gateway", 1024, False), ("direct holding idle ones", 2048, True),
        ("gateway", 1024, False), ("direct holding idle ones in another process", 2048, False)]


def test_versus_selects_by_who_held_the_idle_connections(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    rows = tmp_path / "rows.json"
    client = [conns_pass(k, (900, 1), (1000, 1), idle=512) for k in ("gb", "ga")]
    holder = [{**conns_pass(k, (1200, 1), (1000, 1), idle=512), "idle_by": "holder"} for k in ("gb", "ga")]
    rows.write_text(json.dumps([client[0], holder[0], client[1], holder[1]]))
    out = printed(capsys, "twin_versus", ["--conc", "512", "--a", str(rows), "--b", str(rows), "--a-idle", "512",
                                          "--b-idle", "512", "--b-by", "holder"])
    assert "| tokens/s | 0.900 (0.900–0.900), 0 of 1 | 1.200 (1.200–1.200), 1 of 1 | 1.00 |" in out


def test_the_write_up_matches_its_rows(capsys: pytest.CaptureFixture[str]) -> None:
    """twin-holder-h200x2's README quotes twin_stats.py, twin_versus.py and twin_conns.py."""
    out = printed(capsys, "twin_stats", ["--slow-ttft-ms", "2400", HOLDER])
    plain, held = out.split("idle connections by a process of their own)")
    for line in ("| tokens/s | 1.047 (0.993–1.061), 4 of 5 |", "| TTFT p50 | 1.025 (0.495–1.567), 3 of 5 |",
                 "| TTFT p99 | 1.041 (0.839–1.255), 3 of 5 |", "| request's life mean | 0.969 (0.944–0.986), 0 of 5 |",
                 "| the gateway's only | 2 |", "| the direct side's only | 2 |", "| both | 2 |"):
        assert line in plain, line
    for line in ("| tokens/s | 0.972 (0.930–1.042), 2 of 5 |", "| TTFT p50 | 1.101 (0.440–1.572), 4 of 5 |",
                 "| TTFT p99 | 1.047 (0.809–1.203), 3 of 5 |", "| request's life mean | 0.993 (0.975–1.083), 2 of 5 |",
                 "| the gateway's only | 3 |", "| the direct side's only | 3 |", "| both | 0 |"):
        assert line in held, line
    out = printed(capsys, "twin_versus", ["--conc", "512", "--a", IDLE, "--b", HOLDER, "--a-idle", "512",
                                          "--b-idle", "512", "--b-by", "holder"])
    assert "| TTFT p50 | 0.701 (0.354–1.266), 1 of 6 | 1.101 (0.440–1.572), 4 of 5 | 0.18 |" in out
    out = printed(capsys, "twin_conns", [*DEFAULTS_512, POOL512, IDLE, HOLDER])
    for line in ("| 512 | 4 of 22 (18%) | 0.60 |", "| 1,024 | 21 of 90 (23%) | 0.86 |",
                 "| 1,536 | 9 of 46 (20%) | 0.43 |", "| 2,048 | 7 of 12 (58%) | 0.010 |",
                 "| 2,048 (idle ones in another process) | 3 of 10 (30%) | 0.71 |",
                 "| gateway | 23 of 90 (26%) |", "| direct | 11 of 68 (16%) |", "Fisher p = 0.18."):
        assert line in out, line
    assert _load("twin_modes").fisher_p(7, 12, 3, 10) == pytest.approx(0.2305, abs=1e-4)
    out = printed(capsys, "twin_stats", ["--slow-ttft-ms", "2400", *DEFAULTS_512, IDLE, HOLDER])
    pooled = out.split("each direct side holding")[0]
    for line in ("| tokens/s | 1.014 (0.993–1.031), 15 of 23 |", "| TTFT p50 | 1.131 (0.969–1.354), 14 of 23 |",
                 "| TTFT p99 | 1.089 (1.041–1.169), 17 of 23 |",
                 "| request's life mean | 0.980 (0.963–0.994), 6 of 23 |",
                 "| neither | 28 | 0.990", "| both | 5 | 1.002", "| the gateway's only | 9 |",
                 "| the direct side's only | 4 |",
                 "Sign test on the 13 passes with one side slow: p = 0.27."):
        assert line in pooled, line


def test_the_pool_at_512_against_every_plain_pair_at_1024(capsys: pytest.CaptureFixture[str]) -> None:
    """twin-pool512's later paragraph, README's Limits and docs/gateway.md quote these."""
    out = printed(capsys, "twin_versus", ["--conc", "512", "--a", *DEFAULTS_512, IDLE, HOLDER, "--b", POOL512])
    assert "| tokens/s | 1.014 (0.864–1.103), 15 of 23 | 0.987 (0.840–1.065), 3 of 11 | 0.19 |" in out
    assert "| TTFT p50 | 1.131 (0.495–1.867), 14 of 23 | 0.923 (0.379–1.669), 4 of 11 | 0.11 |" in out


def _window(kind: str, running: dict[str, list[float]], ttft: dict[str, float]) -> dict[str, Any]:
    """A pass at 512 whose sides' vLLMs ran ``running[instance]`` requests in each second since t0."""
    paths = {"gb": ("gateway:b", "direct:a"), "ga": ("gateway:a", "direct:b")}[kind]
    return {"conc": 512, "kind": kind, "_file": 0,
            "sides": {p: {"median_ttft_ms": ttft[p.split(":")[1]]} for p in paths},
            "samples": {i: [[float(t), v, 0.0, 0.0, 0.0] for t, v in enumerate(vs)] for i, vs in running.items()}}


def test_onset_bins_fast_and_slow_windows_and_counts_falls_by_side() -> None:
    onset = _load("twin_onset")
    steady, falls, recovers = [400.0] * 20, [400.0] * 10 + [200.0] * 10, [400.0] * 10 + [200.0] * 5 + [400.0] * 5
    rows = [_window("gb", {"a": steady, "b": falls}, {"a": 1000, "b": 3000}),
            _window("ga", {"a": recovers, "b": steady}, {"a": 1000, "b": 1000}),
            {**_window("gb", {"a": falls, "b": falls}, {"a": 3000, "b": 3000}), "conc": 256}]  # not counted
    per = onset.binned(rows, 512, 2400, 5.0, 20.0)
    assert [b["running"] for b in per[True]] == [[400.0], [400.0], [200.0], [200.0]]  # b's slow window
    assert [sorted(b["running"]) for b in per[False]] == [[400.0] * 3, [400.0] * 3, [200.0, 400.0, 400.0],
                                                          [400.0] * 3]
    assert all(not b["api_cpu"] for b in per[True])  # samples without the engine's columns: no figure
    got = onset.falls(rows, 512, 5.0, 20.0, 280, 370)
    # the gateway's sides: b fell at 10 s and stayed, a fell at 10 s and came back; direct never fell
    assert got == {"gateway": {"windows": 2, "fell": [10.0, 10.0], "back": 1},
                   "direct": {"windows": 2, "fell": [], "back": 0}}


def test_onset_write_up_figures(capsys: pytest.CaptureFixture[str]) -> None:
    """twin-holder's write-up quotes twin_onset.py over every run at 512 with its samples."""
    out = printed(capsys, "twin_onset", [*DEFAULTS_512, POOL512, IDLE, HOLDER])
    for line in ("means over 136 fast and 44 slow windows", "| 5–10 | 397 / 370 |", "| 15–20 | 404 / 294 |",
                 "| 25–30 | 408 / 233 |", "| 50–55 | 368 / 209 | 160.7 / 188.0 | 326 / 148 | 1.03 / 1.05 |",
                 "| direct | 90 | 36 | 10: 8, 15: 12, 20: 4, 30: 3, 35: 1, 40: 3, 45: 1, 50: 4 | 8 |",
                 "| gateway | 90 | 41 | 10: 7, 15: 10, 20: 7, 25: 2, 30: 1, 35: 4, 40: 2, 45: 5, 50: 3 | 7 |"):
        assert line in out, line
    assert _load("twin_modes").fisher_p(41, 90, 36, 90) == pytest.approx(0.547, abs=1e-3)
