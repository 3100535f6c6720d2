"""bench/gpu's scripts as modules: they import each other by bare name, as they run on the GPU
machine (``python3 bench/gpu/X.py``), so their folder goes on ``sys.path`` for the import only."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

GPU_BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu"


def load(name: str) -> ModuleType:
    sys.path.insert(0, str(GPU_BENCH))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(GPU_BENCH))
