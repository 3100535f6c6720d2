"""bench/compare/results/python-build/: the figures bench/README.md quotes for pyenv's and Debian's
CPython 3.11 under the gateway are those of the committed ab.py outputs."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from tests.support.bench_gpu import AB_PASS, ab_passes

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "compare" / "results" / "python-build"


def _read(name: str) -> tuple[str, dict[str, list[float]], list[str]]:
    """Which side ran Debian's interpreter, each side's CPU per pass, and the summary lines ab.py
    printed."""
    lines = (RESULTS / name).read_text().splitlines()
    debian = "new" if "(new: Debian's" in lines[0] else "base"
    assert f"({debian}: Debian's" in lines[0]
    return debian, ab_passes(lines), [x for x in lines if not AB_PASS.match(x)]


def _median_ratio(side: list[float], router: list[float]) -> float:
    return statistics.median(g / r for g, r in zip(side, router, strict=True))


@pytest.mark.parametrize(("name", "passes", "row"), [
    ("events-1.txt", 12, "| 1 | per event, 256 paced streams | −3.2 of 43.7 | 11 of 12 | 1.27 → 1.17 |"),
    ("events-2.txt", 12, "| 2 | per event, 256 paced streams | −1.4 of 39.6 | 9 of 12 | 1.24 → 1.21 |"),
    ("requests-1.txt", 8, "| 1 | per request, 64 concurrent | −30.8 of 234.5 | 8 of 8 | 1.31 → 1.14 |"),
    ("requests-2.txt", 8, "| 2 | per request, 64 concurrent | −32.0 of 240.8 | 8 of 8 | 1.35 → 1.18 |"),
])
def test_the_write_up_quotes_the_committed_passes(name: str, passes: int, row: str) -> None:
    debian, cpu, summary = _read(name)
    pyenv = "base" if debian == "new" else "new"
    deb, pye, router = cpu[f"gateway {debian}"], cpu[f"gateway {pyenv}"], cpu["vllm-router"]
    assert len(deb) == len(pye) == len(router) == passes
    diffs = [d - p for d, p in zip(deb, pye, strict=True)]
    cheaper = sum(x < 0 for x in diffs)
    # The row, recomputed from the passes (ab.py's own summary lines agree to its rounding).
    measure = "per event, 256 paced streams" if name.startswith("events") else "per request, 64 concurrent"
    assert row == (f"| {name[-5]} | {measure}"
                   f" | {statistics.median(diffs):+.1f} of {statistics.median(pye):.1f} | {cheaper} of {passes}"
                   f" | {_median_ratio(pye, router):.2f} → {_median_ratio(deb, router):.2f} |").replace("-", "−", 1)
    assert row in (ROOT / "bench" / "README.md").read_text()
    printed = next(x for x in summary if x.startswith(f"gateway {debian} / vllm-router"))
    assert printed.endswith(f"median {_median_ratio(deb, router):.2f}")


def test_the_floor_under_debians_python_is_the_one_quoted() -> None:
    cpu = ab_passes((RESULTS / "floor-1.txt").read_text().splitlines())
    gw, router = cpu["gateway"], cpu["vllm-router"]
    share = [u - t for u, t in zip(cpu["uvicorn floor"], cpu["raw floor, a task per request"], strict=True)]
    ceiling = [(g - s) / r for g, s, r in zip(gw, share, router, strict=True)]
    ratio = [g / r for g, r in zip(gw, router, strict=True)]
    row = (f"| 1–5 | {', '.join(f'{x:.2f}' for x in ratio)} | {', '.join(f'{x:.1f}' for x in share)} | "
           f"{', '.join(f'{x:.2f}' for x in ceiling)} |")
    median = (f"| median | {statistics.median(ratio):.2f} | {statistics.median(share):.1f} | "
              f"{statistics.median(ceiling):.2f} |")
    text = (ROOT / "bench" / "README.md").read_text()
    assert row in text and median in text, (row, median)
