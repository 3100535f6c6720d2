"""The twin passes with two vLLM API servers per instance (bench/gpu/results/twin-api2-h200x2):
twin_versus.py's table of each path's own readings, and the figures the write-up quotes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.bench_gpu import DEFAULTS_512, HOLDER, IDLE, RESULTS, conns_pass, printed

API2 = str(RESULTS / "twin-api2-h200x2/rows.json.gz")


def test_levels_take_each_paths_own_readings_from_swap_passes(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps([conns_pass("gb", (100, 900), (200, 800)), conns_pass("ga", (300, 700), (400, 600)),
                             {**conns_pass("gb", (1, 1), (1, 1)), "kind": "aa"}]))  # not a swap pass: left out
    b.write_text(json.dumps([conns_pass("gb", (1000, 90), (2000, 80)), conns_pass("ga", (3000, 70), (4000, 60))]))
    out = printed(capsys, "twin_versus", ["--conc", "512", "--a", str(a), "--b", str(b)])
    assert "| direct | tokens/s | 300 (200–400), 2 | 3,000 (2,000–4,000), 2 | 10.00 |" in out
    assert "| gateway | TTFT p50 | 800 (700–900), 2 | 80 (70–90), 2 | 0.10 |" in out


def test_the_write_up_matches_its_rows(capsys: pytest.CaptureFixture[str]) -> None:
    out = printed(capsys, "twin_stats", ["--slow-ttft-ms", "2400", API2])
    for line in ("| tokens/s | 0.983 (0.836–1.000), 1 of 7 |", "| TTFT p50 | 1.008 (0.873–1.657), 5 of 7 |",
                 "| TTFT p99 | 0.964 (0.825–1.714), 3 of 7 |", "| request's life mean | 1.038 (0.975–1.214), 5 of 7 |",
                 "| neither | 15 |", "(median +7)", "| 8 | gb | direct:a | 109.2 | 356.2 |",
                 "| 8 | gb | gateway:b | 324.9 | 61.7 |", "| 2 | gb | gateway:b | 353.4 | 86.3 |"):
        assert line in out, line
    out = printed(capsys, "twin_versus", ["--conc", "512", "--a", *DEFAULTS_512, IDLE, HOLDER, "--b", API2])
    for line in ("| tokens/s | 1.014 (0.864–1.103), 15 of 23 | 0.983 (0.725–1.108), 1 of 7 | 0.10 |",
                 "| TTFT p50 | 1.131 (0.495–1.867), 14 of 23 | 1.008 (0.833–1.982), 5 of 7 | 1.00 |",
                 "| direct | tokens/s | 11,245 (9,492–14,553), 46 | 20,977 (17,795–23,116), 15 | 1.87 |",
                 "| direct | TTFT p50 | 1,299 (810–3,967), 46 | 449 (351–1,052), 15 | 0.35 |",
                 "| gateway | tokens/s | 11,339 (9,564–14,186), 46 | 19,556 (10,513–25,160), 15 | 1.72 |",
                 "| gateway | TTFT p50 | 1,400 (808–3,942), 46 | 479 (409–1,682), 15 | 0.34 |",
                 "| direct | vLLM's processes, cores | 1.85 (1.67–2.06), 46 | 2.89 (2.75–2.96), 15 | 1.56 |",
                 "| gateway | vLLM's processes, cores | 1.88 (1.74–2.04), 46 | 2.84 (2.21–2.97), 15 | 1.52 |"):
        assert line in out, line
