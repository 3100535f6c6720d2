"""What twin_pairs.py's ``--profile`` rests on (bench/gpu/prof.py): py-spy sampling a real busy
process over a window that starts later, its stacks folded into frames a row can carry, and two
sides' frames set beside each other per engine step."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from tests.support.bench_gpu import load as _load

# a process whose one function burns a CPU for 30 s: the frame the profile must find
_BUSY = "def spin():\n    t = __import__('time').time()\n    while __import__('time').time() - t < 30: pass\nspin()"


def test_py_spy_samples_a_busy_process_over_a_window_that_starts_later(tmp_path: Path) -> None:
    prof = _load("prof")
    assert prof.exe() is not None, "py-spy is a dev dependency (pyproject)"
    busy = subprocess.Popen([sys.executable, "-c", _BUSY])
    try:
        t = time.monotonic()
        spy = prof.record(busy.pid, tmp_path / "p.txt", delay=0.5, seconds=1.0)
        assert spy is not None
        folded = prof.collect({"a": {"engine": (spy, tmp_path / "p.txt")}})["a"]["engine"]
        took = time.monotonic() - t
    finally:
        busy.kill()
        busy.wait()
    assert took >= 0.5, took  # the delay was spent first (sleep never returns early)
    # about a second's samples of a process always on a CPU, nearly all in spin()
    assert folded["rate"] == prof.RATE
    assert 0.5 * prof.RATE <= folded["samples"] <= 1.5 * prof.RATE, folded
    spin = next(f for f in folded["inclusive"] if f.startswith("spin "))
    assert folded["inclusive"][spin] >= 0.9 * folded["samples"], folded
    assert folded["self"][spin] >= 0.9 * folded["samples"], folded


def test_a_failed_sampling_keeps_py_spy_s_own_words(tmp_path: Path) -> None:
    prof = _load("prof")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    spy = prof.record(gone.pid, tmp_path / "p.txt", delay=0.0, seconds=1.0)
    folded = prof.collect({"a": {"api": (spy, tmp_path / "p.txt")}})["a"]["api"]
    assert set(folded) == {"error"} and folded["error"], folded


def test_fold_counts_a_frame_once_a_stack_and_drops_line_numbers(tmp_path: Path) -> None:
    prof = _load("prof")
    raw = tmp_path / "raw.txt"
    raw.write_text("run (core.py:10);step (core.py:20);step (core.py:21) 6\n"
                   "run (core.py:10);poll (io.py:5) 3\n"
                   "run (core.py:11) 1\n")
    found = prof.stacks(raw)
    assert found == Counter({("run (core.py)", "step (core.py)", "step (core.py)"): 6,
                             ("run (core.py)", "poll (io.py)"): 3, ("run (core.py)",): 1})
    folded = prof.fold(found, rate=100, keep=0.2)
    assert folded["samples"] == 10
    # step() recursing is 6 samples, not 12; poll's 3 pass the 20 % floor, run's own 1 does not
    assert folded["inclusive"] == {"run (core.py)": 10, "step (core.py)": 6, "poll (io.py)": 3}
    assert folded["self"] == {"step (core.py)": 6, "poll (io.py)": 3}


def test_compare_sets_each_side_s_frames_in_ms_of_cpu_a_step() -> None:
    prof = _load("prof")
    # a: a full core over 50 steps a second (20 ms a step); b: a full core over 40 (25 ms a step)
    row = {"pass": 3, "kind": "gb", "sides": {"direct:a": {}, "gateway:b": {}},
           "engine": {"direct:a": {"steps_per_s": 50.0, "engine_cpu": 1.0},
                      "gateway:b": {"steps_per_s": 40.0, "engine_cpu": 1.0}},
           "prof": {"a": {"engine": {"rate": 100, "samples": 1000, "inclusive": {"step (core.py)": 1000,
                                                                                  "schedule (s.py)": 200}}},
                    "b": {"engine": {"rate": 100, "samples": 500, "inclusive": {"step (core.py)": 500,
                                                                                 "schedule (s.py)": 200}}}}}
    out = prof.compare(row).splitlines()
    # a frame's share of its process's samples (whatever rate py-spy kept up) times the CPU a step
    assert out[0] == "pass 3 (gb), engine, inclusive, ms of CPU a step: direct:a | gateway:b | difference"
    assert out[1] == "  the process's CPU: 20.00 | 25.00 | +5.00"
    assert out[2] == "  step (core.py): 20.00 | 25.00 | +5.00"
    assert out[3] == "  schedule (s.py): 4.00 | 10.00 | +6.00"
    # the API server's per token its clients received: 0.5 of a core over 10,000 tokens/s is 50 µs
    for path, name in (("direct:a", "a"), ("gateway:b", "b")):
        row["sides"][path]["output_throughput"] = 10000.0  # type: ignore[index]
        row["engine"][path]["api_cpu"] = 0.5  # type: ignore[index]
        row["prof"][name]["api"] = row["prof"][name]["engine"]  # type: ignore[index]
    assert prof.compare(row, "api").splitlines()[1:3] == ["  the process's CPU: 50.00 | 50.00 | +0.00",
                                                          "  step (core.py): 50.00 | 50.00 | +0.00"]
    del row["prof"]["b"]  # type: ignore[attr-defined]
    assert "no engine profile of gateway:b" in prof.compare(row)


def test_ratios_take_each_gateway_pass_s_cpu_a_unit_with_or_without_a_profile() -> None:
    prof = _load("prof")

    def row(kind: str, first: str, second: str, engine_cpu: tuple[float, float]) -> dict[str, object]:
        return {"kind": kind, "sides": {first: {"output_throughput": 1000.0}, second: {"output_throughput": 1000.0}},
                "engine": {first: {"steps_per_s": 10.0, "engine_cpu": engine_cpu[0], "api_cpu": 0.5},
                           second: {"steps_per_s": 10.0, "engine_cpu": engine_cpu[1], "api_cpu": 0.5}}}

    rows = [row("gb", "direct:a", "gateway:b", (1.0, 1.1)),
            row("ga", "gateway:a", "direct:b", (0.9, 1.0)),  # the gateway side first: still over the direct one
            row("aa", "direct:a", "direct:b", (1.0, 2.0)),  # no gateway: not a pass of the ratio
            {"kind": "gb", "sides": {"direct:a": {}, "gateway:b": {}}, "engine": {}}]  # no figures
    assert prof.ratios(rows, "engine") == ("engine, ms of CPU a step, gateway ÷ direct, each pass: 1.100, 0.900 "
                                           "(median 1.000; above 1 in 1 of 2)")
    assert prof.ratios(rows, "api").startswith("api, µs of CPU a token, gateway ÷ direct, each pass: 1.000, 1.000 ")
    assert prof.ratios(rows[2:], "api") == "api: no pass with both sides' figures"


GRAPHS = Path(__file__).resolve().parents[1] / "bench/gpu/results/twin-graphs-h200x2"


def test_the_graphs_write_up_matches_its_rows() -> None:
    """twin-graphs-h200x2's README, bench/README and the README quote these figures."""
    stats, prof = _load("twin_stats"), _load("prof")
    graphs = stats.load([str(GRAPHS / f"rows-graphs-{k}.json.gz") for k in (1, 2)])
    eager = stats.load([str(GRAPHS / "rows-eager.json.gz")])
    out = stats.report(graphs)
    assert "| tokens/s | 0.994 (0.977–1.017), 2 of 6 |" in out
    assert "| TTFT p50 | 0.985 (0.930–1.024), 2 of 6 |" in out
    assert "each pass: -6, +8, -1, +2, -11, +16, +9, -17, +8, +2, -11, -16 ms (median +1)" in out
    out = stats.report(eager)
    assert "| tokens/s | 0.981 (0.980–0.982), 0 of 2 |" in out and "| TTFT p50 | 1.012 (0.982–1.041), 1 of 2 |" in out
    older = ("twin-2b8-h200x2/rows.json.gz", "twin-2b8-h200x2/rows-engine.json.gz",
             *(f"twin-apart-h200x2/rows-{k}.json.gz" for k in (1, 2, 3)))
    every = stats.load([str(GRAPHS.parent / f) for f in older])
    assert "| tokens/s | 0.973 (0.949–0.982), 2 of 9 |" in stats.report(every + eager).split("each engine core")[0]
    assert prof.ratios(graphs, "api").endswith("(median 1.022; above 1 in 8 of 12)")
    assert prof.ratios(graphs, "engine").endswith("(median 1.024; above 1 in 6 of 12)")
    assert prof.ratios(eager, "engine").endswith("(median 1.033; above 1 in 3 of 4)")
    assert prof.ratios(eager, "api").endswith("(median 1.011; above 1 in 4 of 4)")
    assert prof.ratios(every + eager, "engine").endswith("(median 1.019; above 1 in 13 of 20)")
    # under vLLM's defaults the API server is the bound, under --enforce-eager the engine core
    sides = [e for r in graphs for e in r["engine"].values()]
    assert (min(e["api_cpu"] for e in sides), max(e["api_cpu"] for e in sides)) == (0.974, 1.02)
    assert (min(e["engine_cpu"] for e in sides), max(e["engine_cpu"] for e in sides)) == (0.46, 0.72)
    sides = [e for r in eager for e in r["engine"].values()]
    assert (min(e["engine_cpu"] for e in sides), max(e["engine_cpu"] for e in sides)) == (1.002, 1.028)
    # the eager engine's forward pass took more CPU a step on the gateway's side in every pass
    in_pass = _load("in_pass")
    forward = []
    for r in eager:
        gateway, direct = stats._paths(r)
        ms = [prof.shares(r["prof"][in_pass.instance(p)]["engine"], prof.per_unit(r, p, "engine"))
              ["LlamaDecoderLayer.forward (vllm/model_executor/models/llama.py)"] for p in (direct, gateway)]
        forward.append(round(ms[1] - ms[0], 2))
    assert forward == [0.71, 1.29, 1.02, 0.41]


def test_vllm_merged_tokens_into_events_alike_on_both_sides() -> None:
    """The write-up's reading that event merging does not explain the API server's CPU a token."""
    import math
    import statistics

    stats, prof = _load("twin_stats"), _load("prof")
    merged, cpu = [], []
    for r in stats.load([str(GRAPHS / f"rows-graphs-{k}.json.gz") for k in (1, 2)]):
        gateway, direct = stats._paths(r)
        merged.append(math.log(r["sides"][gateway]["tokens_per_event"] / r["sides"][direct]["tokens_per_event"]))
        cpu.append(math.log(prof.per_unit(r, gateway, "api") / prof.per_unit(r, direct, "api")))
        assert all(1.007 <= r["sides"][p]["tokens_per_event"] <= 1.063 for p in (direct, gateway))
    assert round(statistics.correlation(merged, cpu), 2) == -0.35
