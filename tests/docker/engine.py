"""A private Docker engine for the image tests (DESIGN §3, docs/deployment.md).

``dockerd`` runs with its own data-root, exec-root, socket and pidfile, with the default bridge and
every iptables rule off, so it touches nothing another engine on the host owns; it is stopped by
its PID. The data-root persists between sessions on purpose: it is the build cache that makes a
second run's builds take seconds instead of minutes.

Every command gets Debian's docker client first in PATH: the machines carry a newer client without
buildx earlier in PATH, and docker-compose builds through whichever ``docker`` PATH finds.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
DATA_ROOT = Path(os.environ.get("FLEET_TEST_DOCKER_ROOT", "/var/lib/fleet-test-docker"))
APT_PACKAGES = ("docker.io", "docker-compose", "debootstrap")
PATH = "/usr/bin:/usr/sbin:/bin:/sbin"
WHEEL_PORT = 38765


def missing_reason() -> str | None:
    """Why a private engine cannot run here, or None. A reason is printed as the skip message."""
    if os.geteuid() != 0:
        return "the Docker tests need root to run a private dockerd"
    for tool in ("dockerd", "docker", "docker-compose", "debootstrap"):
        if shutil.which(tool, path=PATH) is None:
            return f"{tool} is not installed (Debian: apt-get install -y {' '.join(APT_PACKAGES)}; .ci/run does it)"
    return None


@dataclass
class Engine:
    pid: int
    host: str  # DOCKER_HOST
    env: dict[str, str]
    exec_root: Path | None = None  # removed once dockerd has stopped

    def run(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(list(args), env=self.env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)} -> {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
        return done

    def docker(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("/usr/bin/docker", *args, timeout=timeout, check=check)

    def image_size_mb(self, image: str) -> float:
        return int(self.docker("image", "inspect", "-f", "{{.Size}}", image).stdout) / 1e6


def start_engine(run_dir: Path) -> Engine:
    """Start dockerd and wait until it answers; raise (after stopping it) if it does not."""
    DATA_ROOT.mkdir(parents=True, exist_ok=True)
    # exec-root holds unix sockets (108-byte path limit): keep it short, under /run.
    exec_root = Path(f"/run/fleet-dx-{os.getpid()}")
    sock = run_dir / "docker.sock"
    pidfile = run_dir / "docker.pid"
    log = (run_dir / "dockerd.log").open("wb")
    proc = subprocess.Popen(
        ["/usr/sbin/dockerd", "--data-root", str(DATA_ROOT), "--exec-root", str(exec_root),
         "-H", f"unix://{sock}", "--pidfile", str(pidfile),
         "--bridge=none", "--iptables=false", "--ip-masq=false", "--ip6tables=false"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env={"PATH": PATH})
    env = {"PATH": PATH, "HOME": os.environ.get("HOME", "/root"), "DOCKER_HOST": f"unix://{sock}",
           "DOCKER_BUILDKIT": "1", "COMPOSE_DOCKER_CLI_BUILD": "1"}
    engine = Engine(proc.pid, env["DOCKER_HOST"], env, exec_root)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if engine.docker("version", check=False, timeout=10).returncode == 0:
            return engine
        time.sleep(0.5)
    stop_engine(engine)
    raise AssertionError(f"dockerd did not come up; see {run_dir / 'dockerd.log'}")


def _stop(engine: Engine, grace: float) -> None:
    """SIGTERM dockerd (it stops its containers first), wait, then SIGKILL: by PID only."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(engine.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            if os.waitpid(engine.pid, os.WNOHANG)[0] == engine.pid:
                return
        except ChildProcessError:
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.kill(engine.pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(engine.pid, 0)


def stop_engine(engine: Engine, grace: float = 60) -> None:
    """Stop dockerd (below), then remove its exec-root, which it leaves behind in /run."""
    _stop(engine, grace)
    if engine.exec_root is not None:
        shutil.rmtree(engine.exec_root, ignore_errors=True)


@contextlib.contextmanager
def wheel_server(directory: Path) -> Iterator[str]:
    """Serve a wheel directory on loopback for ``pip --find-links`` inside ``docker build
    --network host`` (torch's CPU wheel is a local file here, not on the index)."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    try:
        # A fixed port where free: the URL is a build argument, and a new value would invalidate
        # the build cache of the engine layer (a warm build would reinstall vLLM: 80 s instead of 5).
        server = http.server.ThreadingHTTPServer(("127.0.0.1", WHEEL_PORT), handler)
    except OSError:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def wait_http(url: str, timeout: float, ok: int = 200) -> float:
    """Poll ``url`` until it answers ``ok``; return the seconds it took."""
    start = time.monotonic()
    last = ""
    while time.monotonic() - start < timeout:
        try:
            r = httpx.get(url, timeout=3)
            if r.status_code == ok:
                return time.monotonic() - start
            last = f"{r.status_code} {r.text[:200]}"
        except httpx.HTTPError as e:
            last = repr(e)
        time.sleep(1)
    raise AssertionError(f"{url} not {ok} after {timeout:.0f} s: {last}")
