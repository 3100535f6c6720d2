"""The twin passes with idle connections on the direct side (bench/gpu/results/twin-idle-h200x2):
twin_conns.py's count of slow windows by the connections their vLLM held, its Fisher test,
twin_versus.py keeping a run's plain and idle passes apart, and the write-up's quoted figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.bench_gpu import DEFAULTS_512, IDLE, POOL512, conns_pass, printed
from tests.support.bench_gpu import load as _load


def test_fisher_p_is_the_exact_two_sided_test() -> None:
    modes = _load("twin_modes")
    # 3 of 3 against 0 of 3: that table and its mirror, 1 of C(6, 3) = 20 each
    assert modes.fisher_p(3, 3, 0, 3) == pytest.approx(2 / 20)
    assert modes.fisher_p(0, 3, 3, 3) == pytest.approx(2 / 20)
    assert modes.fisher_p(1, 2, 1, 2) == pytest.approx(1.0)
    # 7 of 12 against 2 of 12 (this run's direct windows with and without idle connections)
    assert modes.fisher_p(7, 12, 2, 12) == pytest.approx(0.0894, abs=1e-4)


def test_windows_count_the_pool_and_the_direct_clients_connections() -> None:
    conns = _load("twin_conns")
    rows = [{**conns_pass("gb", (1, 3000), (1, 1000)), "_file": 0},
            {**conns_pass("ga", (1, 1000), (1, 2500), idle=512), "_file": 0},
            {**conns_pass("gb", (1, 1000), (1, 1000), pool=512), "_file": 1},
            {**conns_pass("gb", (1, 9000), (1, 9000)), "conc": 256, "_file": 1},  # another concurrency
            {"conc": 512, "kind": "aa", "sides": {}, "_file": 1}]  # no gateway in an aa pass
    assert conns.windows(rows, 512, 2400) == [
        (0, "gateway", 1024, True), (0, "direct", 1536, False),
        (0, "gateway", 1024, False), (0, "direct holding idle ones", 2048, True),
        (1, "gateway", 512, False), (1, "direct", 1024, False)]


def test_the_table_pools_runs_by_connections(tmp_path: Path) -> None:
    conns = _load("twin_conns")
    one, two = tmp_path / "one" / "rows.json", tmp_path / "two" / "rows.json"
    for path, rows in ((one, [conns_pass("gb", (1, 3000), (1, 1000)),
                              conns_pass("ga", (1, 3000), (1, 3000), idle=512)]),
                       (two, [conns_pass("gb", (1, 1000), (1, 1000), pool=512)])):
        path.parent.mkdir()
        path.write_text(json.dumps(rows))
    out = conns.table([str(one), str(two)], 512, 2400)
    assert "| one/rows.json | gateway | 1,024 | 2 of 2 |" in out
    assert "| one/rows.json | direct holding idle ones | 2,048 | 1 of 1 |" in out
    assert "| two/rows.json | direct | 1,024 | 0 of 1 |" in out
    assert "| 1,024 | 2 of 3 (67%) |" in out  # two runs' windows at 1,024 pooled
    assert "| 512 | 0 of 1 (0%) | 1.00 |" in out
    assert "| direct | 0 of 2 (0%) |" in out and "| gateway | 2 of 3 (67%) |" in out


def test_versus_keeps_one_runs_plain_and_idle_passes_apart(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([conns_pass("gb", (900, 1), (1000, 1)), conns_pass("ga", (900, 1), (1000, 1)),
                                conns_pass("gb", (1200, 1), (1000, 1), idle=512),
                                conns_pass("ga", (1200, 1), (1000, 1), idle=512)]))
    out = printed(capsys, "twin_versus", ["--conc", "512", "--a", str(rows), "--b", str(rows), "--b-idle", "512"])
    assert "| tokens/s | 0.900 (0.900–0.900), 0 of 1 | 1.200 (1.200–1.200), 1 of 1 | 1.00 |" in out


def test_the_write_up_matches_its_rows(capsys: pytest.CaptureFixture[str]) -> None:
    """twin-idle-h200x2's README quotes twin_stats.py, twin_versus.py and twin_conns.py."""
    out = printed(capsys, "twin_stats", ["--slow-ttft-ms", "2400", IDLE])
    plain, idle = out.split("each direct side holding 512 idle connections)")
    assert "| tokens/s | 1.014 (0.993–1.063), 5 of 6 |" in plain
    assert "| TTFT p50 | 1.130 (0.934–1.374), 3 of 6 |" in plain
    assert "| TTFT p99 | 1.273 (1.054–1.513), 6 of 6 |" in plain
    assert "(median +26)" in plain
    assert "| tokens/s | 0.979 (0.934–1.013), 2 of 6 |" in idle
    assert "| TTFT p50 | 0.701 (0.497–0.991), 1 of 6 |" in idle
    assert "| TTFT p99 | 0.937 (0.716–1.003), 1 of 6 |" in idle
    assert "| the direct side's only | 6 | 0.368 (0.322–0.470) |" in idle
    assert "(median -3)" in idle
    out = printed(capsys, "twin_versus", ["--conc", "512", "--a", IDLE, "--b", IDLE, "--b-idle", "512"])
    assert "| TTFT p50 | 1.130 (0.876–1.380), 3 of 6 | 0.701 (0.354–1.266), 1 of 6 | 0.04 |" in out
    assert "| TTFT p99 | 1.273 (1.031–1.649), 6 of 6 | 0.937 (0.507–1.056), 1 of 6 | 0.01 |" in out
    out = printed(capsys, "twin_stats", ["--slow-ttft-ms", "2400", *DEFAULTS_512, IDLE])
    pooled = out.split("each direct side holding")[0]
    assert "| tokens/s | 1.008 (0.978–1.021), 11 of 18 |" in pooled
    assert "| TTFT p50 | 1.200 (0.969–1.367), 11 of 18 |" in pooled
    assert "Sign test on the 9 passes with one side slow: p = 0.18." in pooled
    out = printed(capsys, "twin_conns", [*DEFAULTS_512, POOL512, IDLE])
    for line in ("| 512 | 4 of 22 (18%) | 0.78 |", "| 1,024 | 14 of 70 (20%) | 0.84 |",
                 "| 1,536 | 5 of 36 (14%) | 0.24 |", "| 2,048 | 7 of 12 (58%) | 0.004 |",
                 "| gateway | 16 of 70 (23%) |", "| direct | 7 of 58 (12%) |", "Fisher p = 0.16."):
        assert line in out, line
