"""bench/gpu's scripts as modules: they import each other by bare name, as they run on the GPU
machine (``python3 bench/gpu/X.py``), so their folder goes on ``sys.path`` for the import only.
bench/compare's scripts import their siblings the same way: ``folder`` names theirs. Also the
reading of bench/compare's pass lines, which more than one results test checks figures against."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

GPU_BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu"
RESULTS = GPU_BENCH / "results"
# every 512 pass under vLLM's defaults with the gateway's pool at 1,024 in twin-defaults, three machines
DEFAULTS_512 = [str(RESULTS / "twin-defaults-h200x2" / f)
                for f in ("rows.json.gz", "rows-512-more-1.json.gz", "rows-512-more-2.json.gz")]
# the same with the gateway's pool at 512 (twin-pool512)
POOL512 = str(RESULTS / "twin-pool512-h200x2" / "rows.json.gz")
# plain passes alternated with passes whose direct client held 512 idle connections (twin-idle)
IDLE = str(RESULTS / "twin-idle-h200x2" / "rows.json.gz")
# plain passes alternated with passes whose direct side's idle connections a process of their own held
HOLDER = str(RESULTS / "twin-holder-h200x2" / "rows.json.gz")
# plain passes with the gateway as shipped at 07482de, two machines (twin-defaults-pick)
DEFAULTS_PICK = [str(RESULTS / "twin-defaults-pick-h200x2" / f) for f in ("rows.json.gz", "rows-2.json.gz")]


def load(name: str, folder: Path = GPU_BENCH) -> ModuleType:
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))


# One server's line in a pass of bench/compare's floor.passes (ab.py, floor.py): its CPU per unit.
AB_PASS = re.compile(r"^pass \d+, ([^:]+): .* user ([\d.]+) µs, system ([\d.]+) µs")


def ab_passes(lines: list[str]) -> dict[str, list[float]]:
    """Each server's CPU per pass (user + system), in pass order, from floor.passes' lines."""
    cpu: dict[str, list[float]] = {}
    for line in lines:
        if m := AB_PASS.match(line):
            cpu.setdefault(m[1], []).append(float(m[2]) + float(m[3]))
    return cpu


def printed(capsys: pytest.CaptureFixture[str], script: str, argv: list[str]) -> str:
    """What bench/gpu's ``script`` prints for ``argv`` (its ``main``): the tables a write-up quotes."""
    load(script).main(argv)
    return capsys.readouterr().out


def conns_pass(kind: str, gateway: tuple[float, float], direct: tuple[float, float], pool: float = 1024,
               idle: int = 0) -> dict[str, Any]:
    """A ``gb``/``ga`` pass at 512: each side's (tokens/s, TTFT p50 ms), the gateway's pool to each
    instance, and idle connections held by the direct side's client."""
    g, d = {"gb": ("gateway:b", "direct:a"), "ga": ("gateway:a", "direct:b")}[kind]
    direct_side: dict[str, Any] = {"output_throughput": direct[0], "median_ttft_ms": direct[1]}
    if idle:
        direct_side["idle_held"] = idle
    row: dict[str, Any] = {"conc": 512, "kind": kind, "queued": 0,
                           "sides": {g: {"output_throughput": gateway[0], "median_ttft_ms": gateway[1]},
                                     d: direct_side},
                           "in_vllm": {g: {"conns_open": pool}, d: {"conns_open": pool}}}
    if idle:
        row["direct_idle"] = idle
    return row
