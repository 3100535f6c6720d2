"""bench/compare/compiled.py: it builds the gateway's modules with mypyc into a copy that imports
them, and bench/README.md quotes its committed outputs (bench/compare/results/compiled/)."""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.bench_gpu import ab_passes, load

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "compare" / "results" / "compiled"
compiled = load("compiled", ROOT / "bench" / "compare")


def row(name: str) -> str:
    """bench/README.md's row for one output, recomputed from its passes."""
    lines = (RESULTS / name).read_text().splitlines()
    build = re.match(r"base: the working tree, interpreted; new: (\S+ \S+), modules ([^;\s]+)", lines[0])
    assert build is not None and build[2] == ",".join(compiled.hot())
    cpu = ab_passes(lines[1:])
    base, new, router = cpu["gateway base"], cpu["gateway new"], cpu["vllm-router"]
    assert len(base) == len(new) == len(router) == 8
    diffs = [n - b for b, n in zip(base, new, strict=True)]
    ratio = [statistics.median(g / r for g, r in zip(side, router, strict=True)) for side in (base, new)]
    measure = "per event, 256 paced streams" if name.startswith("events") else "per request, 64 concurrent"
    python = "Debian's 3.11.2" if "-debian" in name else "pyenv's 3.11.7"  # both sides under it
    return (f"| {build[1]} | {python} | {measure} | {statistics.median(diffs):+.1f} of {statistics.median(base):.1f} | "
            f"{sum(d < 0 for d in diffs)} of 8 | {ratio[0]:.2f} → {ratio[1]:.2f} |").replace("-", "−", 1)


@pytest.mark.parametrize("name", sorted(p.name for p in RESULTS.glob("*.txt")))
def test_the_write_up_quotes_the_committed_passes(name: str) -> None:
    assert row(name) in (ROOT / "bench" / "README.md").read_text(), row(name)


@pytest.mark.skipif(shutil.which("cc") is None, reason="mypyc needs a C compiler: apt-get install gcc")
def test_mypyc_builds_a_module_the_copy_imports(tmp_path: Path) -> None:
    compiled.copy_tree(tmp_path)
    assert compiled.compile_modules(tmp_path, "mypyc", ["sse"]).startswith("mypyc ")
    probe = ("import gateway.sse as s; print(s.__file__.endswith('.so'), s.event_end(b'data: 1\\n\\ndata: 2'))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "9"]
