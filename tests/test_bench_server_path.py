"""bench/compare/server_path.py runs: every request through uvicorn's protocol and the gateway's is
answered (the harness waits for each answer's last byte), and it prints both and their ratio."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_server_path_answers_through_both_protocols_and_prints_their_ratio() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "compare" / "server_path.py"), "--requests", "640",
                          "--rounds", "4"], capture_output=True, text=True, timeout=120, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    figures = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(uvicorn|gateway) +CPU µs per request: median "
                                                                 r"([\d.]+)", out, re.M)}
    assert set(figures) == {"uvicorn", "gateway"} and all(v > 0 for v in figures.values()), out
    assert re.search(r"gateway ÷ uvicorn: median [\d.]+ \(quartiles [\d.]+–[\d.]+\), below 1 in \d+ of 4 rounds", out)
