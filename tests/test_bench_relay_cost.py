"""bench/relay/cost.py runs, and its server rows time the same relay into uvicorn's send and into the
gateway protocol's own chunk write (coalesce.BodyWrite)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

COST = Path(__file__).resolve().parents[1] / "bench" / "relay" / "cost.py"


def test_cost_prints_the_send_and_the_own_write_rows() -> None:
    out = subprocess.run([sys.executable, str(COST), "--events", "5", "--streams", "20", "--repeat", "1"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    send = re.search(r"StreamRelay into uvicorn's send +(\d+) ns per chunk", out)
    own = re.search(r"StreamRelay into the own chunk write +(\d+) ns per chunk +\(([+-]\d+) ns, ([\d.]+)x\)", out)
    assert send and own, out
    assert abs(int(own.group(1)) - int(send.group(1)) - int(own.group(2))) <= 1  # each rounded on its own
