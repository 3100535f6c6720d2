"""bench/gpu's scripts as modules: they import each other by bare name, as they run on the GPU
machine (``python3 bench/gpu/X.py``), so their folder goes on ``sys.path`` for the import only.
bench/compare's scripts import their siblings the same way: ``folder`` names theirs."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

GPU_BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu"
RESULTS = GPU_BENCH / "results"
# every 512 pass under vLLM's defaults with the gateway's pool at 1,024 in twin-defaults, three machines
DEFAULTS_512 = [str(RESULTS / "twin-defaults-h200x2" / f)
                for f in ("rows.json.gz", "rows-512-more-1.json.gz", "rows-512-more-2.json.gz")]


def load(name: str, folder: Path = GPU_BENCH) -> ModuleType:
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))
