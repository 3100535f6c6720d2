"""Session fixtures of the Docker tests: one private engine and the stand-in base images.

They skip, with the reason, only where an engine cannot run (not root, or Debian's docker.io,
docker-compose, debootstrap missing: .ci/run installs them). Anything else that goes wrong fails.
The engine is stopped by its PID in the finalizer, whatever the tests did.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docker.engine import REPO, Engine, missing_reason, start_engine, stop_engine, wheel_server

# What the session measured, printed at the end of the run (docs/deployment.md quotes it).
FIGURES: dict[str, str] = {}
TORCH_WHEELS = Path("/opt/wheels")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.docker)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FIGURES:
        terminalreporter.section("docker figures")
        for name, value in FIGURES.items():
            terminalreporter.write_line(f"{name}: {value}")


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    eng = start_engine(tmp_path_factory.mktemp("dockerd"))
    try:
        start = time.monotonic()
        eng.run(str(REPO / "scripts" / "docker-standins.sh"), timeout=600)
        FIGURES["stand-in base images (0 s when cached)"] = f"{time.monotonic() - start:.0f} s"
        yield eng
    finally:
        stop_engine(eng)


@pytest.fixture(scope="session")
def build_env(engine: Engine) -> Iterator[dict[str, str]]:
    """Environment for builds: where torch's CPU wheel comes from. Here it is a local wheel
    directory (pip's find-links), served on loopback to ``docker build --network host``."""
    if any(TORCH_WHEELS.glob("torch-*.whl")):
        with wheel_server(TORCH_WHEELS) as url:
            yield {**engine.env, "TORCH_INDEX_URL": "", "PIP_FIND_LINKS": url}
    else:
        yield dict(engine.env)
