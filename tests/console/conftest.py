"""Fixtures for the console tests: a fleet under `python -m fleet_supervisor` with the real gateway
and fake vLLM instances, and Debian's chromium driven headless by Playwright.

Chromium is the system one (apt: ``chromium``), passed to Playwright as ``executable_path``:
Playwright's own browser download cannot be fetched here (DESIGN §3). Without it, or without the
playwright package, every test here skips and says which is missing. Screenshots go to
``$FLEET_TEST_ARTIFACTS`` (default ``build/console-artifacts``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.supervisor.conftest import REPO, Reaper, fleet_doc, free_port, wait_until

CLIENT_KEY = "client-key-for-tests"
ADMIN_KEY = "admin-key-for-tests"
XSS = "<img src=x onerror=alert(1)>"
# PATH with the stand-in nvidia-smi first: the supervisor then finds two GPUs (tests/fakes/bin).
FAKE_GPUS_PATH = f"{REPO / 'tests' / 'fakes' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
ARTIFACTS = Path(os.environ.get("FLEET_TEST_ARTIFACTS", REPO / "build" / "console-artifacts"))


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class Fleet:
    proc: subprocess.Popen[bytes]
    out: Path
    gateway: str
    supervisor: str
    reaper: Reaper
    names: list[str] = field(default_factory=list)

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def instances(self) -> dict[str, dict[str, Any]]:
        try:
            body = httpx.get(f"{self.supervisor}/instances", timeout=2).json()
        except httpx.HTTPError:
            return {}
        return {i["name"]: i for i in body["instances"]}

    def wait_running(self, timeout: float = 60) -> None:
        def ready() -> bool:
            assert self.proc.poll() is None, self.output()
            found = self.instances()
            return bool(found) and all(i["state"] == "RUNNING" for i in found.values())
        wait_until(ready, timeout, "every child RUNNING")
        wait_until(lambda: httpx.get(f"{self.gateway}/ready", timeout=2).status_code == 200, 30, "gateway ready")


def tiny_instances(model_dir: str, names: tuple[str, ...] = ("tiny-a", "tiny-b")) -> list[dict[str, Any]]:
    """Fleet-file instances of real CPU vLLM on the tiny model, each serving its own name (the CPU
    demo's shape). CUDA_VISIBLE_DEVICES is the supervisor's to set."""
    from tests.support.real_vllm import CPU_VLLM_ARGS, CPU_VLLM_ENV

    env = {k: v for k, v in CPU_VLLM_ENV.items() if k != "CUDA_VISIBLE_DEVICES"}
    return [{"model": model_dir, "vllm_args": list(CPU_VLLM_ARGS), "env": env, "name": n, "served_model_names": [n]}
            for n in names]


def start_fleet(tmp: Path, instances: list[dict[str, Any]], env: dict[str, str] | None = None,
                real_vllm: bool = False, command: list[str] | None = None, **supervisor: Any) -> Fleet:
    """`python -m fleet_supervisor` (or ``command``, given the fleet file's options) in its own process
    group, the real gateway (default command), keys on; the instances run the fake vLLM unless
    ``real_vllm``."""
    metrics = free_port()
    doc = fleet_doc(tmp, instances, metrics_port=metrics, **supervisor)
    del doc["gateway_command"]  # the default: python -m gateway -c {config}
    if real_vllm:
        del doc["vllm_command"]  # the default: python -m vllm.entrypoints.openai.api_server
    path = tmp / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    reaper = Reaper()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    out = tmp / "up.out"
    with open(out, "wb") as fh:
        proc = subprocess.Popen(
            [*(command or [sys.executable, "-m", "fleet_supervisor"]), "-c", str(path)], cwd=REPO, stdout=fh,
            stderr=subprocess.STDOUT, process_group=0,  # our session, as fleet_supervisor/process.py says why
            env={**clean, **reaper.env(), "FLEET_API_KEYS": CLIENT_KEY, "FLEET_ADMIN_KEYS": ADMIN_KEY,
                 "FLEET_HEALTH_INTERVAL_S": "0.2", "FLEET_HEALTH_FAILURES": "1", **(env or {})})
    reaper.pgids.add(proc.pid)
    fleet = Fleet(proc, out, f"http://127.0.0.1:{doc['gateway']['port']}", f"http://127.0.0.1:{metrics}", reaper,
                  [i["name"] for i in instances])
    return fleet


def stop_fleet(fleet: Fleet) -> None:
    """SIGTERM (a clean stop), then SIGKILL of every process the fleet started, whatever happened."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(fleet.proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        fleet.proc.wait(20)
    fleet.reaper.kill_all()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(fleet.proc.pid, signal.SIGKILL)
    fleet.proc.wait()
    fleet.reaper.reap_adopted()


# Module, not session: a live sync Playwright keeps an event loop running in the main thread, and
# every later test that calls asyncio.run() would fail ("cannot be called from a running event loop").
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    exe = chromium_path()
    if exe is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium; .ci/run installs it)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright package is not installed (pip install -e '.[dev]')")
    pw = sync_playwright().start()
    try:
        b = pw.chromium.launch(executable_path=exe, args=["--disable-gpu", "--disable-dev-shm-usage"])
        try:
            yield b
        finally:
            b.close()
    finally:
        pw.stop()


_OPEN: list[Any] = []  # browser contexts the running test opened (each polls until closed)


@pytest.fixture(autouse=True)
def _close_pages() -> Iterator[None]:
    """A page left open keeps polling the next test's fleet: close every one a test opened."""
    try:
        yield
    finally:
        while _OPEN:
            with contextlib.suppress(Exception):  # the browser may be gone already
                _OPEN.pop().close()


@dataclass
class Watched:
    """A page with its console errors, uncaught exceptions and dialogs (alert() would show here)."""
    page: Any
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def shot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


def open_page(browser: Any, url: str, key: str | None = CLIENT_KEY, admin: str | None = None) -> Watched:
    # The keys go where the page keeps them (sessionStorage) before it runs, as after typing them.
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    _OPEN.append(ctx)
    script = "".join(f"sessionStorage.setItem('fleet.{k}', {v!r});" for k, v in (("key", key), ("admin", admin)) if v)
    if script:
        ctx.add_init_script(script)
    page = ctx.new_page()
    w = Watched(page)
    page.on("console", lambda m: w.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: w.errors.append(f"uncaught: {e}"))

    def dialog(d: Any) -> None:
        w.dialogs.append(d.message)
        d.dismiss()
    page.on("dialog", dialog)
    page.goto(url + "/ui")
    return w
