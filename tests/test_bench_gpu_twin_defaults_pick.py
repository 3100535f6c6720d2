"""The plain twin passes at 512 under vLLM's defaults with the gateway at 07482de
(bench/gpu/results/twin-defaults-pick-h200x2): the write-up's, README's and bench/README's figures,
this run's and every plain pair's at 512, against the saved rows."""

from __future__ import annotations

import pytest

from tests.support.bench_gpu import DEFAULTS_512, DEFAULTS_PICK, HOLDER, IDLE, POOL512, load, printed

# every plain pair at 512 under vLLM's defaults with the pool at 1,024: the 23 before and this run's 7
PLAIN_512 = [*DEFAULTS_512, IDLE, HOLDER, *DEFAULTS_PICK]


def test_this_run_matches_its_write_up(capsys: pytest.CaptureFixture[str]) -> None:
    out = printed(capsys, "twin_stats", ["--slow-ttft-ms", "2400", *DEFAULTS_PICK])
    for line in ("(7 gb, 7 ga, 0 aa passes; 0 requests queued in the gateway)",
                 "| tokens/s | 0.976 (0.969–1.064), 3 of 7 |", "| TTFT p50 | 1.099 (0.931–1.556), 4 of 7 |",
                 "| TTFT p99 | 1.027 (0.914–1.136), 4 of 7 |", "| request's life mean | 1.014 (0.931–1.050), 4 of 7 |",
                 "| neither | 3 | 0.909", "| both | 4 | 1.121", "| the gateway's only | 4 | 2.752",
                 "| the direct side's only | 3 | 0.393", "Sign test on the 7 passes with one side slow: p = 1.00."):
        assert line in out, line


def test_every_plain_pair_at_512(capsys: pytest.CaptureFixture[str]) -> None:
    out = printed(capsys, "twin_stats", ["--slow-ttft-ms", "2400", *PLAIN_512])
    pooled = out.split("each direct side holding")[0]
    for line in ("(30 gb, 30 ga, 0 aa passes;", "| tokens/s | 1.012 (0.993–1.024), 18 of 30 |",
                 "| TTFT p50 | 1.115 (0.981–1.269), 18 of 30 |", "| TTFT p99 | 1.080 (1.031–1.136), 21 of 30 |",
                 "| request's life mean | 0.984 (0.971–0.999), 10 of 30 |", "| 0.398 (30) |", "| 4,290 / 172 |",
                 "| neither | 31 | 0.985", "| both | 9 | 1.101", "| the gateway's only | 13 | 2.849",
                 "| the direct side's only | 7 | 0.406", "Sign test on the 20 passes with one side slow: p = 0.26."):
        assert line in pooled, line


def test_both_sides_fall_alike(capsys: pytest.CaptureFixture[str]) -> None:
    out = printed(capsys, "twin_onset", ["--conc", "512", "--slow-ttft-ms", "2400", "--bin", "5", *DEFAULTS_PICK])
    assert "| direct | 14 | 8 |" in out and "| gateway | 14 | 8 |" in out
    out = printed(capsys, "twin_onset", ["--conc", "512", "--slow-ttft-ms", "2400", "--bin", "5", *DEFAULTS_512,
                                         POOL512, IDLE, HOLDER, *DEFAULTS_PICK])
    assert "| direct | 104 | 44 |" in out and "| gateway | 104 | 49 |" in out
    assert load("twin_modes").fisher_p(49, 104, 44, 104) == pytest.approx(0.577, abs=1e-3)


def test_the_pool_at_512_against_all_thirty(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/gateway.md's "The pool's size, not settled" quotes this."""
    out = printed(capsys, "twin_versus", ["--conc", "512", "--a", *PLAIN_512, "--b", POOL512])
    assert "| tokens/s | 1.012 (0.864–1.168), 18 of 30 | 0.987 (0.840–1.065), 3 of 11 | 0.21 |" in out
    assert "| TTFT p50 | 1.115 (0.369–2.987), 18 of 30 | 0.923 (0.379–1.669), 4 of 11 | 0.11 |" in out
