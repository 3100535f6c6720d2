from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.procs import FakeVllm, Gateway, Proc, instances

DEFAULT_KNOBS = {"latency": 0.0, "token_delay": 0.0, "tokens": 8, "status": 200, "hang": False,
                 "health_status": 200, "drop_after": -1, "merge": 1, "eof_delay": 0.0}


@pytest.fixture(scope="module")
def tmp_mod(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gw")


@pytest.fixture(scope="module")
def fakes(tmp_mod: Path) -> Iterator[list[FakeVllm]]:
    """Two replicas of 'm1' and one server of 'm2', shared by a test module."""
    started: list[FakeVllm] = []
    try:
        started.append(FakeVllm(tmp_mod, ["m1"]))
        started.append(FakeVllm(tmp_mod, ["m1"]))
        started.append(FakeVllm(tmp_mod, ["m2", "m2-alias"]))
        yield started
    finally:
        for f in started:
            f.stop()


@pytest.fixture(autouse=True)
def _reset_knobs(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "fakes" in request.fixturenames:
        for f in request.getfixturevalue("fakes"):
            if f.alive():
                f.configure(**DEFAULT_KNOBS)


@pytest.fixture(scope="module")
def gateway(tmp_mod: Path, fakes: list[FakeVllm]) -> Iterator[Gateway]:
    gw = Gateway(tmp_mod, instances(*fakes))
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    """Processes a test starts itself: append each right after it starts; all are stopped after."""
    started: list[Proc] = []
    try:
        yield started
    finally:
        for p in reversed(started):
            p.stop()
