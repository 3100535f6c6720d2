"""Real processes for tests: fake vLLM servers and gateways on loopback, stopped by process group.

Each process starts in its own session; ``stop()`` kills the whole group and waits, so a failed
test never leaves a server behind (the fixtures call it in ``finally``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
FAKE_VLLM = ROOT / "tests" / "fakes" / "fake_vllm.py"


def stat_fields(pid: int | str) -> list[bytes] | None:
    """/proc/PID/stat after "(comm)": [state, ppid, pgrp, ...]; None once the process is gone.
    (comm may hold spaces and parentheses, hence the split on the last ')'.)"""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None


def pid_alive(pid: int) -> bool:
    """True for a live process; False once it is gone or only a zombie."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] != b"Z"


def live_pids() -> list[int]:
    """Every live (non-zombie) process, from /proc."""
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and pid_alive(int(e))]


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid``."""
    found = []
    for entry in os.listdir("/proc"):
        fields = stat_fields(entry) if entry.isdigit() else None
        if fields is not None and fields[0] != b"Z" and int(fields[2]) == pgid:
            found.append(int(entry))
    return found


_GIVEN: set[int] = set()


def free_port() -> int:
    """A port free now and not handed out before by this process: the kernel may give the same
    ephemeral port to two binds in a row once the first socket is closed, and a test that asks for
    several ports before starting anything (a gateway and its instances) then got one twice."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


class Proc:
    def __init__(self, argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.argv = list(argv)
        self.log = log
        self._fh = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(self.argv, stdout=self._fh, stderr=subprocess.STDOUT, cwd=ROOT,
                                      env={**os.environ, **(env or {})}, start_new_session=True)
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def _started(self, check: Any) -> None:
        """Run the readiness check; on failure stop the process before raising, since the caller
        never gets an object to stop."""
        try:
            check()
        except BaseException:
            self.stop()
            raise

    def signal(self, sig: int) -> None:
        os.killpg(self.pid, sig)

    def stop(self, grace: float = 5.0) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.popen.wait()
        self._fh.close()

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def wait_http(url: str, proc: Proc | None = None, timeout: float = 30.0, status: int = 200) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{proc.argv[:4]} exited with {proc.popen.returncode}:\n{proc.tail()}")
        try:
            r = httpx.get(url, timeout=2)
            if r.status_code == status:
                return
            last = f"status {r.status_code}"
        except httpx.HTTPError as e:
            last = repr(e)
        time.sleep(0.05)
    raise TimeoutError(f"{url} not {status} after {timeout}s ({last})" + (f"\n{proc.tail()}" if proc else ""))


class FakeVllm(Proc):
    def __init__(self, tmp: Path, models: Sequence[str], *flags: str, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.models = list(models)
        argv = [sys.executable, str(FAKE_VLLM), "--port", str(self.port), "--served-model-name", *models,
                "--fake-name", f"fake-{self.port}", *flags]
        super().__init__(argv, tmp / f"fake-{self.port}.log")
        self._started(lambda: wait_http(self.url + "/health", self,
                                        status=503 if "--fake-never-healthy" in flags else 200))

    def configure(self, **knobs: Any) -> None:
        httpx.post(self.url + "/_fake/config", json=knobs, timeout=5).raise_for_status()

    def stats(self) -> dict[str, int]:
        return dict(httpx.get(self.url + "/_fake/stats", timeout=5).json())

    def restart(self) -> None:
        self.stop()
        self._fh = open(self.log, "ab")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(self.argv, stdout=self._fh, stderr=subprocess.STDOUT, cwd=ROOT,
                                      start_new_session=True)
        self.pid = self.popen.pid
        wait_http(self.url + "/health", self)


class Gateway(Proc):
    """``python -m gateway -c FILE`` with fast health settings unless overridden."""

    def __init__(self, tmp: Path, config: dict[str, Any], env: dict[str, str] | None = None,
                 wait_ready: bool = True, args: Sequence[str] = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        keys = (env or {}).get("FLEET_API_KEYS", "").split(",")
        self.auth = {"Authorization": f"Bearer {keys[0].strip()}"} if keys[0] else {}
        cfg = tmp / f"gateway-{self.port}.json"
        cfg.write_text(json.dumps(config))
        base = {"FLEET_HOST": "127.0.0.1", "FLEET_PORT": str(self.port), "FLEET_HEALTH_INTERVAL_S": "0.2",
                "FLEET_HEALTH_FAILURES": "2", "FLEET_HEALTH_SUCCESSES": "2", "FLEET_LOG_LEVEL": "info"}
        super().__init__([sys.executable, "-m", "gateway", "-c", str(cfg), *args], tmp / f"gateway-{self.port}.log",
                         {**base, **(env or {})})
        def ready() -> None:
            wait_http(self.url + "/health", self)
            if wait_ready and not wait_until(self.all_healthy, timeout=15):
                raise TimeoutError(f"gateway backends not all healthy: {httpx.get(self.url + '/fleet').text}")

        self._started(ready)

    def all_healthy(self) -> bool:
        fleet = httpx.get(self.url + "/fleet", headers=self.auth, timeout=5).json()
        return all(b["healthy"] for b in fleet["backends"])


def instances(*fakes: FakeVllm) -> dict[str, Any]:
    """The multi-instance Infernet shape for some fakes, models taken from the fakes."""
    return {"backend": "vllm",
            "vllm_instances": [{"host": f.url, "models": f.models, "name": f"fake-{f.port}"} for f in fakes],
            "served_models": sorted({m for f in fakes for m in f.models})}


def wait_until(pred: Any, timeout: float = 10.0, interval: float = 0.05) -> bool:
    """Poll ``pred()`` until it is true; False on timeout (the caller asserts, with context)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return bool(pred())
