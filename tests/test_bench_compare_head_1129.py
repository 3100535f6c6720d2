"""The five comparison runs against vllm-router of 2026-11-29 (bench/compare/results/head-2026-11-29):
bench/README's table and its 15-pass medians against the saved outputs."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "bench" / "compare" / "results" / "head-2026-11-29"
REQUEST, EVENT = "cpu_us_per_request_64 <= 1.5x vllm-router", "cpu_us_per_event_paced256 <= 1.5x vllm-router"


def _runs() -> list[dict[str, Any]]:
    return [json.loads((FOLDER / f"compare-{i}.json").read_text())["issue_targets"] for i in range(1, 6)]


def test_the_table_is_the_saved_passes() -> None:
    text = (ROOT / "bench" / "README.md").read_text()
    section = text[text.index("### The same comparison at 9fca715"):]
    section = section[:section.index("\n### ")]
    for i, run in enumerate(_runs(), start=1):
        row = next(line for line in section.splitlines() if line.startswith(f"| [{i}]"))
        cells = re.findall(r"([\d.]+(?:, [\d.]+)+) \(\*\*([\d.]+)\*\*\)", row)
        for (passes, median), key in zip(cells, (REQUEST, EVENT), strict=True):
            assert [float(x) for x in passes.split(", ")] == run[key]["passes"]
            assert float(median) == run[key]["median"]


def test_the_fifteen_pass_medians() -> None:
    runs = _runs()
    per_request = [x for r in runs for x in r[REQUEST]["passes"]]
    per_event = [x for r in runs for x in r[EVENT]["passes"]]
    assert (statistics.median(per_request), min(per_request), max(per_request)) == (1.37, 1.01, 1.58)
    assert (statistics.median(per_event), min(per_event), max(per_event)) == (1.12, 0.87, 1.27)
    text = (ROOT / "bench" / "README.md").read_text()
    assert "per request **1.37×** (1.01–1.58), per event **1.12×** (0.87–1.27)" in text
