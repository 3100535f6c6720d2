"""bench/compare/idle_upstream.py: connections held idle beside a load on real vLLM, and the table
that compares passes with and without them."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

from tests.support.bench_gpu import load

if TYPE_CHECKING:
    from tests.support.real_vllm import RealVllm

pytest_plugins = ["tests.support.real_vllm"]

COMPARE = Path(__file__).resolve().parents[1] / "bench" / "compare"


def _idle() -> ModuleType:
    return load("idle_upstream", COMPARE)  # its siblings import by bare name, as when run as a script


def _row(mode: str, tokens: float, api: float = 100.0) -> dict[str, Any]:
    return {"mode": mode, "tokens_s": tokens, "ttft_p50_ms": 100.0, "api_ms_per_1k": api, "rest_ms_per_1k": 50.0}


def test_each_mode_is_compared_with_the_none_passes_of_its_own_block() -> None:
    iu = _idle()
    # block 1: none at 100 and 120 (mean 110); block 2: none at 200 both
    rows = [_row("none", 100), _row("fresh", 99), _row("used", 110), _row("used", 88), _row("fresh", 121),
            _row("none", 120),
            _row("none", 200, 80), _row("fresh", 220, 80), _row("used", 180, 88), _row("used", 190, 96),
            _row("fresh", 200, 80), _row("none", 200, 80)]
    table = iu.report(rows)
    # fresh: 0.9, 1.1, 1.1, 1.0; used: 1.0, 0.8, 0.9, 0.95
    assert "| fresh | 1.050 (0.900–1.100), 2 of 4 above 1 | 1.000 (1.000–1.000), 0 of 4 above 1 |" in table
    assert "| used | 0.925 (0.800–1.000), 0 of 4 above 1 |" in table
    assert "1.050 (1.000–1.200), 2 of 4 above 1" in table  # used's API server CPU per token: 1, 1, 1.1, 1.2


def test_held_connections_stay_open_until_the_server_closes_them(tmp_path: Path) -> None:
    from tests.support.procs import FakeVllm

    iu = _idle()
    fake = FakeVllm(tmp_path, ["m"])
    try:
        socks = iu.hold(fake.port, 3, used=True) + iu.hold(fake.port, 2, used=False)
        assert iu.still_open(socks) == 5
        fake.stop()
        assert iu.still_open(socks) == 0
    finally:
        fake.stop()


@pytest.mark.realvllm
def test_one_pass_measures_the_real_servers_cpu_beside_idle_connections(real_vllm: RealVllm, tmp_path: Path) -> None:
    iu = _idle()
    a = argparse.Namespace(idle=4, conc=2, warmup=1.0, window=2.0, perf=None)
    # fresh: a connection that never carried a request has no keep-alive timer in vLLM's uvicorn,
    # so the shared server's 5 s default does not close it before the window ends
    row = iu.one_pass(real_vllm, "fresh", a, tmp_path, 0)
    assert row["mode"] == "fresh" and row["idle_open"] == 4, row
    assert row["tokens_s"] > 0 and row["ttft_p50_ms"] > 0, row
    assert row["api_ms_per_1k"] > 0 and row["rest_ms_per_1k"] > 0, row  # the API server and its engine


def test_the_write_up_matches_the_committed_rows(capsys: pytest.CaptureFixture[str]) -> None:
    results = COMPARE / "results"
    _idle().main(["--rows", str(results / "idle-upstream-1.json"), str(results / "idle-upstream-2.json")])
    out = capsys.readouterr().out
    assert "| fresh | 0.959 (0.770–1.244), 5 of 16 above 1 | 0.989 (0.797–1.177), 6 of 16 above 1 |" in out
    assert "| used | 0.892 (0.705–1.273), 5 of 16 above 1 | 1.032 (0.855–1.273), 9 of 16 above 1 |" in out
    assert "1.035 (0.883–1.167), 10 of 16 above 1" in out and "1.051 (0.781–1.451), 10 of 16 above 1" in out
    _idle().main(["--rows", str(results / "idle-upstream-3-conc8.json")])
    out = capsys.readouterr().out
    assert "| fresh | 1.102 (0.841–1.164), 5 of 8 above 1 |" in out and "1.020 (0.900–1.235), 5 of 8 above 1" in out
    assert "| used | 0.929 (0.841–1.178), 3 of 8 above 1 |" in out and "1.046 (0.862–1.158), 5 of 8 above 1" in out
    _idle().main(["--rows", *(str(results / f) for f in (
        "idle-upstream-1.json", "idle-upstream-2.json", "idle-upstream-3-conc8.json"))])
    out = capsys.readouterr().out
    assert "1.028 (0.883–1.235), 15 of 24 above 1" in out and "1.051 (0.781–1.451), 15 of 24 above 1" in out
