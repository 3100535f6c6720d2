"""bench/compare/own_server.py runs: every request through each of its five servers is answered (the
harness waits for each answer's last byte), and it prints each one's cost, the gateway's saving
against each lean server and, given an end-to-end pair, the ratio that saving would leave."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVERS = {"uvicorn", "gateway", "lean asgi", "lean, no asgi", "raw head"}


def test_own_server_answers_through_every_server_and_prints_the_most_it_could_save() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "compare" / "own_server.py"), "--requests", "640",
                          "--rounds", "4", "--compare", "64,54"], capture_output=True, text=True, timeout=120,
                         check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    figures = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\S.*?) +CPU µs per request: median ([\d.]+)",
                                                                 out, re.M)}
    assert set(figures) == SERVERS and all(v > 0 for v in figures.values()), out
    savings = re.findall(r"^gateway − (lean asgi|lean, no asgi|raw head): (-?[\d.]+) µs per request at most; "
                         r"64 − \S+ against vllm-router's 54: ([\d.]+)x at best$", out, re.M)
    assert {name for name, _, _ in savings} == SERVERS - {"uvicorn", "gateway"}, out
    for _, saved, ratio in savings:
        assert abs((64 - float(saved)) / 54 - float(ratio)) < 0.001


def test_compare_takes_two_figures() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "compare" / "own_server.py"), "--compare", "64"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and "--compare takes two figures" in r.stderr
