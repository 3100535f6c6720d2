"""The GPU benchmark's arithmetic (bench/gpu): how many requests a pass held in flight, when each
client process ended, pair_stats.py's pairs, which must stay within one file (one machine), and
pin.py's placement of the processes on CPUs."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.bench_gpu import load as _load


def _part(starts: list[float], ttft: float, gaps: int) -> dict[str, Any]:
    n = len(starts)
    return {"start_times": starts, "ttfts": [ttft] * n, "itls": [[0.1] * gaps] * n, "errors": [""] * n,
            "total_output_tokens": n * (gaps + 1), "completed": n}


def test_merge_reports_what_the_pass_held() -> None:
    merge = _load("bench_clients").merge
    # Client 0: four requests of 1 s each, two at a time, done at 2 s. Client 1: two that wait 2 s
    # for a first token, then two more; done at 4 s. Latencies sum to 4 + 7 = 11 s over a 4 s span.
    res = merge([_part([0, 0, 1, 1], 0.5, 5), {**_part([0, 0, 3, 3], 0.5, 5), "ttfts": [2, 2, 0.5, 0.5]}])
    assert res["duration"] == pytest.approx(4.0)
    assert res["mean_in_flight"] == pytest.approx(2.8)  # 11 / 4, rounded to 0.1
    assert res["client_end_s"] == [2.0, 4.0]


def _row(target: str, p: int, tps: float) -> dict[str, Any]:
    """A serve_pairs.py row at 512 concurrent, one client process, pass ``p``."""
    return {"tag": f"c512-k1-p{p}-{target}", "target": target, "conc": 512, "clients": 1,
            "output_throughput": tps, "median_ttft_ms": 100.0, "p99_ttft_ms": 200.0,
            "request_throughput": 1.0, "mean_ttft_ms": 100.0, "mean_itl_ms": 10.0,
            "total_output_tokens": 128, "completed": 1}


def test_pool_pairs_passes_within_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stats = _load("pair_stats")

    # File a: one pair, the gateway at 1.1x. File b: a direct pass 0 whose gateway pass is missing.
    # Paired by pass number alone, a's gateway would meet b's direct: 0.11x.
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps([_row("direct", 0, 100.0), _row("gateway", 0, 110.0)]))
    b.write_text(json.dumps([_row("direct", 0, 1000.0)]))
    stats.main(["--pool", str(a), str(b)])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("| gateway | tokens/s"))
    assert line.split("|")[6].strip() == "1.10 (1)"  # the median of the pairs' ratios, one pair


def test_pairs_interval_leaves_out_how_fast_each_machine_was(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    stats = _load("pair_stats")

    # Two machines, one 10x faster; on each the gateway is 1.1x direct in every pair.
    files = []
    for name, speed in (("slow", 100.0), ("fast", 1000.0)):
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps([_row(t, p, speed * (1.1 if t == "gateway" else 1.0) * (1 + p / 100))
                                 for p in range(3) for t in ("direct", "gateway")]))
        files.append(str(f))
    stats.main(["--pool", *files])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("| gateway | tokens/s"))
    cells = [c.strip() for c in line.split("|")]
    lo, hi = (float(v) for v in cells[5].split("–"))
    assert hi / lo > 5  # the ratio of medians mixes the machines
    assert cells[6] == "1.10 (6)" and cells[7] == "1.10–1.10" and cells[8] == "6 of 6"


def test_pin_plan_gives_each_part_whole_cores_of_its_own() -> None:
    pin = _load("pin")
    # 4 cores of 2 hyperthreads, siblings numbered n and n + 4 as on many hosts.
    where = pin.plan([[0, 4], [1, 5], [2, 6], [3, 7]])
    assert where == {"gateway": {3, 7}, "client": {2, 6}, "vllm": {0, 1, 4, 5}}
    with pytest.raises(SystemExit, match="3 physical cores"):
        pin.plan([[0, 1], [2, 3]])


def test_client_core_is_the_last_and_up_gets_the_rest() -> None:
    pin = _load("pin")
    client, rest = pin.off_host([[0, 4], [1, 5], [2, 6], [3, 7]])
    assert client == {3, 7} and rest == {0, 1, 2, 4, 5, 6}
    with pytest.raises(SystemExit, match="3 physical cores"):
        pin.off_host([[0, 1], [2, 3]])


def test_pin_moves_every_thread_of_a_process() -> None:
    pin = _load("pin")
    # A real child with a second thread: both are moved, not only the main one.
    code = "import threading, time; threading.Thread(target=time.sleep, args=(30,)).start(); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{child.pid}/task")) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        cpu = min(os.sched_getaffinity(0))
        assert pin.pin([child.pid], {cpu}) == 2
        assert all(os.sched_getaffinity(int(t)) == {cpu} for t in os.listdir(f"/proc/{child.pid}/task"))
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize(("placed", "says", "tps", "ratio"), [
    ({"pin": {"cpus": {"gateway": [3]}}}, "CPUs pinned", 100.0, "1.00 (1)"),
    ({"client_cpus": [15]}, "the client on CPUs [15] of its own", 110.0, "1.10 (1)"),
])
def test_pairs_placed_otherwise_are_a_table_of_their_own(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          placed: dict[str, Any], says: str, tps: float,
                                                          ratio: str) -> None:
    """Pinned pairs (run --pin) and pairs with the client on a core of its own (start --client-core)
    are not pooled with plain ones."""
    stats = _load("pair_stats")
    f = tmp_path / "rows.json"
    f.write_text(json.dumps([_row("direct", 0, 100.0), _row("gateway", 0, 90.0), {**_row("direct", 0, 100.0), **placed},
                             {**_row("gateway", 0, tps), **placed}]))
    stats.main([str(f)])
    out = capsys.readouterr().out
    assert says in out
    lines = [x for x in out.splitlines() if x.startswith("| gateway | tokens/s")]
    assert [x.split("|")[6].strip() for x in lines] == ["0.90 (1)", ratio]


def test_noise_pairs_only_passes_that_ran_back_to_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A/A pairs are two passes of one target adjacent in the file, in the order serve_pairs.py ran
    them (direct, gateway, gateway, direct, direct…); a pass of another setting between two breaks
    the pair."""
    stats = _load("pair_stats")
    f = tmp_path / "rows.json"
    f.write_text(json.dumps([
        _row("direct", 0, 100.0), _row("gateway", 0, 100.0), _row("gateway", 1, 110.0), _row("direct", 1, 100.0),
        {**_row("direct", 9, 1.0), "conc": 256},  # another concurrency ran between: no pair across it
        _row("direct", 2, 121.0), _row("gateway", 2, 121.0)]))
    stats.main([str(f)])
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("| tokens/s |")][-1]  # 256's, then 512's
    cells = [c.strip() for c in line.split("|")]
    # One A/A pair only (gateway 100 then 110), so no sd; gateway ÷ direct: 1.0, 1.1, 1.0.
    assert cells[2] == "— (1)"
    sd = statistics.stdev([0.0, math.log(1.1), 0.0])
    assert cells[3] == f"{sd:.3f} (3)"
    assert cells[4] == f"{(1.645 * sd / 0.01) ** 2:,.0f} / {(1.645 * sd / 0.05) ** 2:,.0f}"
