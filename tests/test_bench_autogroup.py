"""bench/autogroup.py: the shipped supervisor starts its children in the supervisor's session, the
bench's baseline in sessions of their own (fake vLLM, the real supervisor and gateway); the table comes out
of the rows (the real run needs real vLLM and minutes: it is the bench itself)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import autogroup

from tests.console.conftest import start_fleet, stop_fleet


@pytest.mark.parametrize("mode", autogroup.MODES)
def test_children_sessions_shipped_and_baseline(tmp_path: Path, mode: str) -> None:
    command = [sys.executable, "-c", autogroup.OWN_SESSION] if mode == "own_session" else None
    fleet = start_fleet(tmp_path, [{"name": "a", "model": "m-a"}], command=command)
    try:
        fleet.wait_running(timeout=60)
        found = fleet.instances()
        sup = os.getsid(fleet.proc.pid)
        assert {n: os.getpgid(i["pid"]) == i["pid"] for n, i in found.items()} == {"a": True, "gateway": True}
        assert {n: os.getsid(i["pid"]) == sup for n, i in found.items()} == {n: mode == "shipped" for n in found}
    finally:
        stop_fleet(fleet)


def test_schedstat_and_the_table() -> None:
    run, wait = autogroup.schedstat(os.getpid())
    assert run > 0 and wait >= 0

    def row(mode: str, wait: float, restarts: int) -> dict[str, Any]:
        return {"mode": mode, "gateway_wait_share": wait, "supervisor_wait_share": wait / 2,
                "first_chunk_s": [0.05, 1.5 if restarts else 0.07, None], "longest_silence_s": 0.4,
                "failed": restarts, "unhealthy_lines": 2 * restarts, "gateway_restarts": restarts,
                "tokens_per_s": 300.0}

    table = autogroup.report([row("own_session", 0.3, 1), row("shipped", 0.01, 0), row("shipped", 0.03, 0)])
    assert "| own_session | 1 | 30.0 % (30.0 %–30.0 %) | 15.0 % (15.0 %–15.0 %) | 1.50 s (1.50–1.50) |" in table
    assert "| shipped | 2 | 2.0 % (1.0 %–3.0 %) | 1.0 % (0.5 %–1.5 %) | 0.07 s (0.07–0.07) |" in table
    assert "| 1 of 3 | 2 / 1 | 300 (300–300) |" in table and "| 0 of 6 | 0 / 0 |" in table, table
