"""bench/compare/shared_accept.py end to end, small: the fake upstream as two processes on one
listening socket behind this tree's gateway, one short round, the table printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.bench_gpu import load

ROOT = Path(__file__).resolve().parents[1]


def test_a_short_run_prints_each_trees_split(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load("shared_accept", ROOT / "bench" / "compare")
    bench.main([str(ROOT), str(ROOT), "--passes", "1", "--rounds", "1", "--seconds", "5", "--gap", "2",
                "--conc", "8", "--tokens", "8"])
    out = capsys.readouterr().out
    assert out.count("; 0 errors") == 2  # a pass a tree, every stream answered
    for tree in ("base", "new"):
        row = next(line for line in out.splitlines() if line.startswith(f"| {tree} | 1 |"))
        share = float(row.split("|")[3].split()[0])
        assert 0.5 <= share <= 1.0  # the busier of two processes, and bytes were sent


def test_accepts_alone_count_every_connection(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load("shared_accept", ROOT / "bench" / "compare")
    bench.main(["--accepts", "8", "--passes", "1"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("8 connections")]
    assert len(lines) == 4  # at once, one at a time, 5 ms and 50 ms apart
    for line in lines:
        busier, other = (int(x) for x in line.rsplit(": ", 1)[1].split(" / "))
        assert busier + other == 8 and busier >= other
