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
    assert took >= 1.4, took  # the delay, then a second of sampling
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


def test_compare_sets_each_side_s_frames_in_ms_a_step() -> None:
    prof = _load("prof")
    # 10 s window, 100 samples a second: a at 50 steps a second (500 steps), b at 40 (400)
    row = {"pass": 3, "kind": "gb", "timing": {"window": 10.0},
           "sides": {"direct:a": {}, "gateway:b": {}},
           "engine": {"direct:a": {"steps_per_s": 50.0}, "gateway:b": {"steps_per_s": 40.0}},
           "prof": {"a": {"engine": {"rate": 100, "samples": 1000, "inclusive": {"step (core.py)": 1000,
                                                                                  "schedule (s.py)": 200}}},
                    "b": {"engine": {"rate": 100, "samples": 1000, "inclusive": {"step (core.py)": 1000,
                                                                                  "schedule (s.py)": 400}}}}}
    out = prof.compare(row).splitlines()
    # 1,000 samples are 10 s of CPU: 20 ms a step over 500 steps, 25 over 400
    assert out[1] == "  all samples: 20.00 | 25.00 | +5.00"
    assert out[2] == "  step (core.py): 20.00 | 25.00 | +5.00"
    assert out[3] == "  schedule (s.py): 4.00 | 10.00 | +6.00"
    del row["prof"]["b"]  # type: ignore[attr-defined]
    assert "no engine profile of gateway:b" in prof.compare(row)
