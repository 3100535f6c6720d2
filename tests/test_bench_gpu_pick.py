"""bench/gpu/pick_pairs.py's table against its committed runs (results/pick-api2-h200, pick-api2-conc-h200;
results/pick-defaults-h200 to pick-defaults6-h200 under vLLM's defaults;
pick-ramp-h200, a pilot of a ramped start, and pick-ramp2-h200, the two starts alternated), its
cycle of ramps, and the switchable pick pick-api2 alternated (gateway_variant.py ``--variant switch``)."""

from __future__ import annotations

import gzip
import json
import random
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.upstream import Origin
from tests.support.bench_gpu import DEFAULTS_512, DEFAULTS_PICK, HOLDER, IDLE, RESULTS, load, printed

pick_pairs = load("pick_pairs")
variant = load("gateway_variant")


# Every one-at-a-time run under vLLM's defaults at 512, in the order they ran.
_DESIGN = [str(RESULTS / f) for f in ("pick-defaults-h200/rows.json.gz", "pick-defaults2-h200/rows.json.gz",
                                      "pick-ramp-h200/rows.json.gz", "pick-ramp2-h200/rows-1.json.gz",
                                      "pick-ramp2-h200/rows-2.json.gz", "pick-defaults3-h200/rows.json.gz",
                                      "pick-defaults4-h200/rows.json.gz", "pick-defaults5-h200/rows.json.gz",
                                      "pick-defaults6-h200/rows.json.gz", "pick-defaults7-h200/rows.json.gz",
                                      "pick-defaults8-h200/rows.json.gz")]


def _rows(run: str = "pick-api2-h200") -> list[dict[str, Any]]:
    with gzip.open(RESULTS / run / "rows.json.gz", "rt") as f:
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


def test_neighbouring_pairs_under_vllms_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    """results/pick-defaults-h200's README: passes d, g, g, d on one instance with one API server."""
    rows = _rows("pick-defaults-h200")
    assert [r["kind"] for r in rows].count("d") == 12 and [r["kind"] for r in rows].count("g") == 12
    out = pick_pairs.report(rows)
    for line in ("| direct | 12 | 10605 (9966–14304) | 1525 (1078–3438) | 4709 (3231–5532) |",
                 "| gateway | 12 | 11425 (9915–15561) | 1920 (802–3547) | 4336 (2436–5118) |",
                 "| tokens/s | 1.077, p = 0.319 |", "| TTFT p50 ms | 1.259, p = 0.671 |",
                 "Neighbouring passes as pairs (12)", "| tokens/s, g ÷ d | 1.075 (1.009–1.091) | 9 |",
                 "| TTFT p50 ms, g ÷ d | 1.107 (0.835–1.943) | 6 |", "| TTFT p99 ms, g ÷ d | 1.000 (0.793–1.200) | 6 |",
                 "| request's life mean, g ÷ d | 0.936 (0.923–1.009) | 4 |",
                 "gateway 5, direct 2 of 12; in a pair alone: gateway 5, direct 2"):
        assert line in out, line
    # a run whose passes do not pair (r, r) leaves those out: pick-api2's d,g,r,r,g,d holds 5 d/g pairs
    assert "Neighbouring passes as pairs (5)" in pick_pairs.report(_rows())
    onset = printed(capsys, "twin_onset", ["--conc", "512", _DESIGN[0]])
    assert "| direct | 12 | 6 |" in onset and "| gateway | 12 | 7 |" in onset
    assert "means over 17 fast and 7 slow windows" in onset


def test_the_second_run_under_vllms_defaults_alone_and_pooled(capsys: pytest.CaptureFixture[str]) -> None:
    """results/pick-defaults2-h200's README: the same run again, then both runs as one report."""
    rows = _rows("pick-defaults2-h200")
    assert [r["kind"] for r in rows].count("d") == 12 and [r["kind"] for r in rows].count("g") == 12
    out = pick_pairs.report(rows)
    for line in ("| tokens/s, g ÷ d | 1.024 (0.982–1.097) | 8 |", "| TTFT p50 ms, g ÷ d | 0.923 (0.748–2.666) | 4 |",
                 "| TTFT p99 ms, g ÷ d | 0.879 (0.834–1.234) | 4 |",
                 "| request's life mean, g ÷ d | 0.972 (0.903–1.118) | 5 |",
                 "gateway 4, direct 1 of 12; in a pair alone: gateway 4, direct 1"):
        assert line in out, line
    files = _DESIGN[:2]
    both = pick_pairs.pooled(files)
    assert sorted(r["pass"] for r in both) == list(range(48))  # the second run's passes numbered on
    out = pick_pairs.report(both)
    for line in ("Neighbouring passes as pairs (24)", "| tokens/s, g ÷ d | 1.072 (1.009–1.089) | 17 |",
                 "| TTFT p50 ms, g ÷ d | 0.978 (0.811–1.762) | 10 |",
                 "| TTFT p99 ms, g ÷ d | 0.915 (0.826–1.131) | 10 |",
                 "| request's life mean, g ÷ d | 0.942 (0.923–1.008) | 9 |",
                 "gateway 9, direct 3 of 24; in a pair alone: gateway 9, direct 3"):
        assert line in out, line
    onset = printed(capsys, "twin_onset", ["--conc", "512", *files])
    assert "| direct | 24 | 10 |" in onset and "| gateway | 24 | 12 |" in onset
    for line in ("| gateway | 138 | 24 | direct | 0.089 |", "| direct | 77.5 | 24 | gateway |  |",
                 "| slow | 166 | 12 | fast | 0.002 |", "| fast | 91 | 36 | slow |  |"):
        assert line in onset, line
    assert "Slow among the windows whose fewest was 120 or more: 11 of 25; below 120: 1 of 23" in onset


def test_the_first_requests_drain_in_the_twin_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """pick-defaults2-h200's README: the same dip read over the twin runs' plain 512 passes."""
    onset = printed(capsys, "twin_onset", ["--conc", "512", *DEFAULTS_512, IDLE, HOLDER, *DEFAULTS_PICK])
    for line in ("| gateway | 89 | 82 | direct | 0.022 |", "| direct | 137.5 | 82 | gateway |  |",
                 "| slow | 159 | 53 | fast | < 0.001 |", "| fast | 81 | 111 | slow |  |",
                 "Slow among the windows whose fewest was 120 or more: 43 of 86; below 120: 10 of 78"):
        assert line in onset, line


def test_pooled_runs_pair_passes_within_a_run_only(tmp_path: Any) -> None:
    """A run that ends on an odd pass leaves it unpaired: the next run's first pass starts a pair."""
    def row(n: int, kind: str) -> dict[str, Any]:
        return {"pass": n, "kind": kind}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps([row(0, "d"), row(1, "g"), row(2, "g")]))
    b.write_text(json.dumps([row(0, "d"), row(1, "g")]))
    assert [(r["pass"], r["kind"]) for r in pick_pairs.pooled([str(a), str(b)])] == [
        (0, "d"), (1, "g"), (2, "g"), (4, "d"), (5, "g")]


def test_the_ramp_pilot_reads_per_start() -> None:
    """results/pick-ramp-h200's README: 4 passes with the streams started over 10 s, then 4 together."""
    rows = _rows("pick-ramp-h200")
    assert [(r["kind"], r["timing"].get("ramp", 0.0)) for r in rows] == [
        ("d", 10.0), ("g", 10.0), ("g", 10.0), ("d", 10.0), ("d", 0.0), ("g", 0.0), ("g", 0.0), ("d", 0.0)]
    ramp, together = pick_pairs.report(pick_pairs.ramped(rows, 10.0)), pick_pairs.report(pick_pairs.ramped(rows, 0.0))
    for line in ("Neighbouring passes as pairs (2)", "| tokens/s, g ÷ d | 1.087 (0.979–1.196) | 1 |",
                 "| TTFT p50 ms, g ÷ d | 0.697 (0.630–0.765) | 0 |", "gateway 0, direct 0 of 2"):
        assert line in ramp, line
    for line in ("Neighbouring passes as pairs (2)", "| tokens/s, g ÷ d | 1.206 (1.205–1.207) | 2 |",
                 "| TTFT p50 ms, g ÷ d | 2.256 (1.501–3.011) | 2 |", "gateway 2, direct 0 of 2"):
        assert line in together, line


def test_the_alternated_ramp_run_and_every_one_at_a_time_pair(capsys: pytest.CaptureFixture[str]) -> None:
    """results/pick-ramp2-h200's README: each start with the pilot, then all five runs of this design."""
    files = _DESIGN[2:5]  # the pilot and the alternated run's two files
    rows = pick_pairs.pooled(files)
    assert [r["timing"].get("ramp", 0.0) for r in rows[8:]] == ([10.0] * 4 + [0.0] * 4) * 2
    ramp, together = pick_pairs.report(pick_pairs.ramped(rows, 10.0)), pick_pairs.report(pick_pairs.ramped(rows, 0.0))
    for line in ("Neighbouring passes as pairs (6)", "| tokens/s, g ÷ d | 0.985 (0.926–1.135) | 2 |",
                 "| TTFT p50 ms, g ÷ d | 0.745 (0.565–0.970) | 1 |", "| TTFT p99 ms, g ÷ d | 0.832 (0.705–0.977) | 1 |",
                 "gateway 2, direct 3 of 6"):
        assert line in ramp, line
    for line in ("Neighbouring passes as pairs (6)", "| tokens/s, g ÷ d | 1.126 (1.012–1.205) | 5 |",
                 "| TTFT p50 ms, g ÷ d | 1.035 (0.647–2.057) | 3 |", "| TTFT p99 ms, g ÷ d | 1.179 (0.859–1.597) | 3 |",
                 "gateway 2, direct 1 of 6"):
        assert line in together, line
    every = pick_pairs.pooled(_DESIGN[:5])
    out = pick_pairs.report(every)
    for line in ("Neighbouring passes as pairs (36)", "| tokens/s, g ÷ d | 1.063 (1.009–1.088) | 24 |",
                 "| TTFT p50 ms, g ÷ d | 0.949 (0.840–1.103) | 14 |",
                 "| TTFT p99 ms, g ÷ d | 0.915 (0.852–1.043) | 14 |", "gateway 13, direct 7 of 36"):
        assert line in out, line
    out = pick_pairs.report(pick_pairs.ramped(every, 0.0))
    for line in ("Neighbouring passes as pairs (30)", "| tokens/s, g ÷ d | 1.072 (1.015–1.091) | 22 |",
                 "| TTFT p50 ms, g ÷ d | 0.978 (0.868–1.359) | 13 |", "in a pair alone: gateway 11, direct 4"):
        assert line in out, line
    onset = printed(capsys, "twin_onset", ["--conc", "512", "--ramp", "0", *files])
    assert "Slow among the windows whose fewest was 120 or more: 1 of 5; below 120: 2 of 7" in onset
    assert "| slow | 58 | 3 | fast | 0.712 |" in onset
    onset = printed(capsys, "twin_onset", ["--conc", "512", "--ramp", "10", *files])
    assert "means over 7 fast and 5 slow windows" in onset and "| slow | 43 | 5 | fast | 0.222 |" in onset


# Each run's README: (its folder, lines of its own report, of the report over the design's files up
# to it, of those files' passes started together, and of twin_onset on it).
_DEFAULTS_RUNS = [
    ("pick-defaults3-h200",
     ("Neighbouring passes as pairs (10)", "| tokens/s, g ÷ d | 0.993 (0.984–1.064) | 4 |",
      "| TTFT p50 ms, g ÷ d | 1.012 (0.852–1.128) | 5 |", "| TTFT p99 ms, g ÷ d | 1.021 (0.960–1.180) | 5 |",
      "gateway 2, direct 1 of 10; in a pair alone: gateway 1, direct 0",
      "mean over the pairs, g ÷ d: 1.129 (0.918–1.390); median of the 8 pairs with neither slow: 0.921"),
     ("Neighbouring passes as pairs (46)", "| tokens/s, g ÷ d | 1.043 (1.000–1.075) | 28 |",
      "| TTFT p50 ms, g ÷ d | 0.965 (0.854–1.070) | 19 |", "| TTFT p99 ms, g ÷ d | 0.968 (0.884–1.045) | 19 |",
      "gateway 15, direct 8 of 46; in a pair alone: gateway 12, direct 5",
      "mean over the pairs, g ÷ d: 1.116 (0.932–1.322); median of the 26 pairs with neither slow: 0.874"),
     ("Neighbouring passes as pairs (40)", "| TTFT p50 ms, g ÷ d | 0.978 (0.898–1.115) | 18 |",
      "in a pair alone: gateway 12, direct 4",
      "mean over the pairs, g ÷ d: 1.192 (0.991–1.422); median of the 23 pairs with neither slow: 0.915"),
     "| slow | 81 | 3 | fast | 0.916 |"),
    ("pick-defaults4-h200",
     ("Neighbouring passes as pairs (10)", "| tokens/s, g ÷ d | 1.011 (0.982–1.107) | 6 |",
      "| TTFT p50 ms, g ÷ d | 0.931 (0.881–1.217) | 4 |", "| TTFT p99 ms, g ÷ d | 1.044 (0.861–1.209) | 6 |",
      "gateway 4, direct 4 of 10; in a pair alone: gateway 1, direct 1",
      "mean over the pairs, g ÷ d: 0.980 (0.777–1.247); median of the 5 pairs with neither slow: 0.936"),
     ("Neighbouring passes as pairs (56)", "| tokens/s, g ÷ d | 1.025 (1.000–1.075) | 34 |",
      "| TTFT p50 ms, g ÷ d | 0.949 (0.874–1.066) | 23 |", "| TTFT p99 ms, g ÷ d | 0.975 (0.898–1.064) | 25 |",
      "| request's life mean, g ÷ d | 0.949 (0.926–1.005) | 23 |",
      "gateway 19, direct 12 of 56; in a pair alone: gateway 13, direct 6",
      "mean over the pairs, g ÷ d: 1.086 (0.944–1.249); median of the 31 pairs with neither slow: 0.915"),
     ("Neighbouring passes as pairs (50)", "| TTFT p50 ms, g ÷ d | 0.968 (0.915–1.103) | 22 |",
      "gateway 17, direct 9 of 50; in a pair alone: gateway 13, direct 5",
      "mean over the pairs, g ÷ d: 1.138 (0.970–1.332); median of the 28 pairs with neither slow: 0.928"),
     "| slow | 178 | 8 | fast | 0.464 |"),
    ("pick-defaults5-h200",
     ("Neighbouring passes as pairs (10)", "| tokens/s, g ÷ d | 0.963 (0.887–1.015) | 4 |",
      "| TTFT p50 ms, g ÷ d | 1.776 (1.134–2.524) | 8 |", "| TTFT p99 ms, g ÷ d | 1.126 (0.961–1.338) | 6 |",
      "gateway 5, direct 1 of 10; in a pair alone: gateway 5, direct 1",
      "mean over the pairs, g ÷ d: 1.616 (1.099–2.207); median of the 4 pairs with neither slow: 1.177"),
     ("Neighbouring passes as pairs (66)", "| tokens/s, g ÷ d | 1.014 (0.996–1.064) | 38 |",
      "| TTFT p50 ms, g ÷ d | 0.978 (0.915–1.146) | 31 |", "| TTFT p99 ms, g ÷ d | 0.976 (0.949–1.077) | 31 |",
      "| request's life mean, g ÷ d | 0.957 (0.935–1.005) | 28 |",
      "gateway 24, direct 13 of 66; in a pair alone: gateway 18, direct 7",
      "mean over the pairs, g ÷ d: 1.152 (1.005–1.318); median of the 35 pairs with neither slow: 0.926"),
     ("Neighbouring passes as pairs (60)", "| TTFT p50 ms, g ÷ d | 1.029 (0.933–1.191) | 30 |",
      "gateway 22, direct 10 of 60; in a pair alone: gateway 18, direct 6",
      "mean over the pairs, g ÷ d: 1.206 (1.043–1.396); median of the 32 pairs with neither slow: 0.933"),
     "| slow | 142.5 | 6 | fast | 0.804 |"),
    ("pick-defaults6-h200",
     ("Neighbouring passes as pairs (7)", "| tokens/s, g ÷ d | 1.080 (0.922–1.122) | 4 |",
      "| TTFT p50 ms, g ÷ d | 1.075 (0.619–1.638) | 4 |", "| TTFT p99 ms, g ÷ d | 0.982 (0.569–1.235) | 3 |",
      "gateway 2, direct 1 of 7; in a pair alone: gateway 2, direct 1",
      "mean over the pairs, g ÷ d: 1.124 (0.748–1.571); median of the 4 pairs with neither slow: 1.001"),
     ("Neighbouring passes as pairs (73)", "| tokens/s, g ÷ d | 1.015 (0.996–1.066) | 42 |",
      "| TTFT p50 ms, g ÷ d | 0.988 (0.926–1.134) | 35 |", "| TTFT p99 ms, g ÷ d | 0.977 (0.948–1.066) | 34 |",
      "| request's life mean, g ÷ d | 0.960 (0.935–1.008) | 31 |",
      "gateway 26, direct 14 of 73; in a pair alone: gateway 20, direct 8",
      "mean over the pairs, g ÷ d: 1.150 (1.005–1.306); median of the 39 pairs with neither slow: 0.926"),
     ("Neighbouring passes as pairs (67)", "| TTFT p50 ms, g ÷ d | 1.062 (0.930–1.164) | 34 |",
      "gateway 24, direct 11 of 67; in a pair alone: gateway 20, direct 7",
      "mean over the pairs, g ÷ d: 1.199 (1.051–1.369); median of the 36 pairs with neither slow: 0.933"),
     "| slow | 84 | 3 | fast | 0.876 |"),
    ("pick-defaults7-h200",
     ("Neighbouring passes as pairs (4)", "| tokens/s, g ÷ d | 0.952 (0.908–1.013) | 1 |",
      "| TTFT p50 ms, g ÷ d | 1.182 (0.387–2.391) | 2 |", "| TTFT p99 ms, g ÷ d | 1.109 (0.573–2.213) | 3 |",
      "gateway 1, direct 1 of 4; in a pair alone: gateway 1, direct 1",
      "mean over the pairs, g ÷ d: 1.160 (0.572–2.368); median of the 2 pairs with neither slow: 1.182"),
     ("Neighbouring passes as pairs (77)", "| tokens/s, g ÷ d | 1.012 (0.991–1.057) | 43 |",
      "| TTFT p50 ms, g ÷ d | 0.988 (0.926–1.134) | 37 |", "| TTFT p99 ms, g ÷ d | 0.982 (0.960–1.066) | 37 |",
      "| request's life mean, g ÷ d | 0.962 (0.943–1.009) | 33 |",
      "gateway 27, direct 15 of 77; in a pair alone: gateway 21, direct 9",
      "mean over the pairs, g ÷ d: 1.150 (1.014–1.304); median of the 41 pairs with neither slow: 0.930"),
     ("Neighbouring passes as pairs (71)", "| TTFT p50 ms, g ÷ d | 1.062 (0.936–1.218) | 36 |",
      "gateway 25, direct 12 of 71; in a pair alone: gateway 21, direct 8",
      "mean over the pairs, g ÷ d: 1.196 (1.049–1.365); median of the 38 pairs with neither slow: 0.949"),
     "| slow | 84.5 | 2 | fast | 0.502 |"),
    ("pick-defaults8-h200",
     ("Neighbouring passes as pairs (4)", "| tokens/s, g ÷ d | 1.081 (0.866–1.132) | 3 |",
      "| TTFT p50 ms, g ÷ d | 0.913 (0.697–1.112) | 1 |", "| TTFT p99 ms, g ÷ d | 0.902 (0.726–1.267) | 1 |",
      "gateway 0, direct 0 of 4; in a pair alone: gateway 0, direct 0",
      "mean over the pairs, g ÷ d: 0.806 (0.631–1.046); median of the 4 pairs with neither slow: 0.913"),
     ("Neighbouring passes as pairs (81)", "| tokens/s, g ÷ d | 1.013 (0.996–1.057) | 46 |",
      "| TTFT p50 ms, g ÷ d | 0.978 (0.926–1.128) | 38 |", "| TTFT p99 ms, g ÷ d | 0.977 (0.948–1.063) | 38 |",
      "| request's life mean, g ÷ d | 0.962 (0.943–1.003) | 35 |",
      "gateway 27, direct 15 of 81; in a pair alone: gateway 21, direct 9",
      "mean over the pairs, g ÷ d: 1.138 (0.998–1.287); median of the 45 pairs with neither slow: 0.930"),
     ("Neighbouring passes as pairs (75)", "| TTFT p50 ms, g ÷ d | 0.996 (0.936–1.134) | 37 |",
      "gateway 25, direct 12 of 75; in a pair alone: gateway 21, direct 8",
      "mean over the pairs, g ÷ d: 1.181 (1.027–1.339); median of the 42 pairs with neither slow: 0.949"),
     "Slow among the windows whose fewest was 120 or more: 0 of 6; below 120: 0 of 2"),
]


@pytest.mark.parametrize(("run", "alone", "pooled", "together", "onset"), _DEFAULTS_RUNS,
                         ids=[r[0] for r in _DEFAULTS_RUNS])
def test_a_run_under_vllms_defaults_and_every_pair_of_the_design_so_far(
        capsys: pytest.CaptureFixture[str], run: str, alone: tuple[str, ...], pooled: tuple[str, ...],
        together: tuple[str, ...], onset: str) -> None:
    """A run's README: the run alone, then every file of this design up to it, every pass and those
    started together, with TTFT p50's ratio of the means and its fast pairs' median."""
    upto = _DESIGN.index(str(RESULTS / run / "rows.json.gz")) + 1
    every = pick_pairs.pooled(_DESIGN[:upto])
    for out, lines in ((pick_pairs.report(_rows(run)), alone), (pick_pairs.report(every), pooled),
                       (pick_pairs.report(pick_pairs.ramped(every, 0.0)), together)):
        for line in lines:
            assert line in out, line
    assert onset in printed(capsys, "twin_onset", ["--conc", "512", _DESIGN[upto - 1]])


def test_two_api_servers_at_256_and_1024_read_by_concurrency(capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """results/pick-api2-conc-h200's README: one file holding passes at 1,024 and at 256, pairs within
    one concurrency; ``report --conc`` reads each alone, and without it the file's 10 pairs."""
    path = str(RESULTS / "pick-api2-conc-h200" / "rows.json.gz")
    expect = {"256": ("| tokens/s, g ÷ d | 1.184 (1.090–1.193) | 5 |",
                      "| TTFT p50 ms, g ÷ d | 0.849 (0.814–0.963) | 0 |",
                      "mean over the pairs, g ÷ d: 0.875 (0.839–0.920)"),
              "1024": ("| tokens/s, g ÷ d | 0.967 (0.833–1.038) | 1 |",
                       "| TTFT p50 ms, g ÷ d | 1.165 (0.778–1.380) | 3 |",
                       "mean over the pairs, g ÷ d: 1.080 (0.909–1.282)")}
    for conc, lines in expect.items():
        monkeypatch.setattr("sys.argv", ["pick_pairs.py", "report", "--conc", conc, path])
        pick_pairs.main()
        out = capsys.readouterr().out
        for line in ("Neighbouring passes as pairs (5)", "gateway 0, direct 0 of 5", *lines):
            assert line in out, (conc, line)
    assert "Neighbouring passes as pairs (10)" in pick_pairs.report(_rows("pick-api2-conc-h200"))


def test_the_ratio_of_means_counts_the_side_that_is_slow_more_often() -> None:
    """Two pairs alike and one where only the gateway is slow: the pairs' median reads 1, the ratio of
    the means reads the slow pass; the fast pairs' median leaves it out."""
    side = {"output_throughput": 1.0, "p99_ttft_ms": 1.0, "mean_life_ms": 1.0}
    rows = [{"pass": i, "kind": k, "sides": {f"{k}:a": {**side, "median_ttft_ms": t}}}
            for i, (k, t) in enumerate([("d", 1000), ("g", 1000), ("g", 3000), ("d", 1000), ("d", 1000), ("g", 1000)])]
    out = "\n".join(pick_pairs.neighbours(rows, pick_pairs.MEASURES))
    assert "| TTFT p50 ms, g ÷ d | 1.000 (" in out and "in a pair alone: gateway 1, direct 0" in out
    assert "mean over the pairs, g ÷ d: 1.667 (" in out and "median of the 2 pairs with neither slow: 1.000" in out


def test_run_takes_one_ramp_a_cycle_of_kinds(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--ramp 10,0``: a whole cycle of kinds under each ramp in turn, a second run going on with it."""
    (tmp_path / "client-cpu.json").write_text("3")
    (tmp_path / "variant.pid").write_text("1")
    monkeypatch.setattr(pick_pairs, "one", lambda _m, _w, kind, _c, n, _cl, timing, _v: {
        "pass": n, "kind": kind, "timing": timing})
    timing = {"warmup": 15.0, "window": 30.0, "tail": 10.0}
    pick_pairs.run("m", tmp_path, 512, 6, timing, ["d", "g", "g", "d"], [10.0, 0.0])
    rows = pick_pairs.run("m", tmp_path, 512, 4, timing, ["d", "g", "g", "d"], [10.0, 0.0])
    assert [r["timing"].get("ramp", 0.0) for r in rows] == [10.0] * 4 + [0.0] * 4 + [10.0] * 2
    assert "ramp" not in rows[4]["timing"]  # together: as a run without --ramp records it
    assert [r["pass"] for r in pick_pairs.ramped(rows, 0.0)] == [4, 5, 6, 7]


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
