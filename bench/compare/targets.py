"""The processes of the benchmark: the fake upstream and each proxy under test, pinned and accounted.

Every process starts in its own session with its CPU affinity set before exec, so its whole tree
(nginx's worker, uvicorn's workers, tokio's threads) stays on the CPU it was given; its CPU time
is utime+stime of every process in its group, read from /proc. A target that cannot be installed
or started raises ``Unavailable`` with the reason, and the run goes on without it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.support.procs import free_port  # noqa: E402

HERE = Path(__file__).resolve().parent
CLK = os.sysconf("SC_CLK_TCK")
TWO_CPUS = len(os.sched_getaffinity(0)) >= 2


class Unavailable(Exception):
    pass


def _pgroup_cpu(pgid: int) -> tuple[float, float]:
    """User and system CPU seconds of the process group."""
    user = system = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            f = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            if int(f[2]) == pgid:  # field 5 (pgrp), after state and ppid
                user += int(f[11])
                system += int(f[12])
    return user / CLK, system / CLK


class Proc:
    """A process group pinned to ``cpu``; ``cpu_s()`` is the group's CPU seconds so far."""

    def __init__(self, name: str, argv: Sequence[str], log: Path, cpu: int, env: dict[str, str] | None = None,
                 cwd: Path = ROOT) -> None:
        self.name = name
        self.log = log
        self._fh = open(log, "ab")  # noqa: SIM115 - closed in stop()

        def pin() -> None:
            if TWO_CPUS:
                os.sched_setaffinity(0, {cpu})

        self.popen = subprocess.Popen(list(argv), stdout=self._fh, stderr=subprocess.STDOUT, cwd=cwd,
                                      env={**os.environ, **(env or {})}, start_new_session=True, preexec_fn=pin)
        self.pid = self.popen.pid

    def cpu_s(self) -> float:
        return sum(_pgroup_cpu(self.pid))

    def cpu_split(self) -> tuple[float, float]:
        """``cpu_s()`` as user and system seconds (system: syscalls and, on loopback, the TCP work
        they do for both ends)."""
        return _pgroup_cpu(self.pid)

    def wait_http(self, url: str, timeout: float, ok: Callable[[httpx.Response], bool] | None = None) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise Unavailable(f"{self.name} exited with {self.popen.returncode}: {self.tail()}")
            try:
                r = httpx.get(url, timeout=2)
                if ok(r) if ok else r.status_code == 200:
                    return
                last = f"status {r.status_code}"
            except httpx.HTTPError as e:
                last = repr(e)
            time.sleep(0.1)
        raise Unavailable(f"{self.name}: {url} not ready after {timeout:.0f}s ({last}): {self.tail()}")

    def tail(self, n: int = 6) -> str:
        return " | ".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(wait)
                if not any(_in_group(self.pid)):
                    break
        self._fh.close()


def _in_group(pgid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                    out.append(int(d))
    return out


def start_upstream(work: Path, cpu: int, token_ms: float) -> tuple[Proc, str]:
    port = free_port()
    p = Proc("upstream", [sys.executable, str(HERE / "upstream.py"), "--port", str(port), "--token-ms",
                          str(token_ms)], work / "upstream.log", cpu)
    url = f"http://127.0.0.1:{port}"
    p.wait_http(url + "/health", 20)
    return p, url


def ensure_venv(venvs: Path, name: str, spec: str, exe: str, timeout: float = 420) -> Path:
    """``venvs/name`` with ``spec`` installed by pip; the path of its ``exe``."""
    venv = venvs / name
    binary = venv / "bin" / exe
    if binary.exists():
        return binary
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=120,
                       capture_output=True)
        r = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", spec], timeout=timeout,
                           capture_output=True, text=True)
    except (subprocess.SubprocessError, OSError) as e:
        raise Unavailable(f"installing {spec}: {e}") from e
    if r.returncode != 0 or not binary.exists():
        raise Unavailable(f"pip install {spec} failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    return binary


def version(venv_bin: Path, dist: str) -> str:
    r = subprocess.run([str(venv_bin.parent / "python"), "-c",
                        f"import importlib.metadata as m; print(m.version({dist!r}))"], capture_output=True, text=True)
    return r.stdout.strip() or "?"


# Each starter: (work dir, upstream url, cpu, venvs dir) -> (Proc, base url, version string).

def gateway(work: Path, up: str, cpu: int, _: Path, env: dict[str, str] | None = None,
            cwd: Path = ROOT, launcher: Sequence[str] = ()) -> tuple[Proc, str, str]:
    """The gateway of the tree at ``cwd`` (the working tree's by default) in front of ``up``; ``env``
    adds to or overrides its settings; ``launcher``: the command that runs it, given ``-c CONFIG``
    (``python -m gateway`` by default)."""
    port = free_port()
    cfg = work / "gateway.json"
    cfg.write_text(json.dumps({"backend": "vllm", "served_models": ["m", "paced"],
                               "vllm_instances": [{"host": up, "models": ["m", "paced"], "name": "up"}]}))
    env = {"FLEET_HOST": "127.0.0.1", "FLEET_PORT": str(port), "FLEET_LOG_LEVEL": "warning",
           "FLEET_HEALTH_INTERVAL_S": "5", "FLEET_ACCESS_LOG": "false", **(env or {})}
    argv = [*(launcher or (sys.executable, "-m", "gateway")), "-c", str(cfg)]
    p = Proc("gateway", argv, work / "gateway.log", cpu, env, cwd)
    url = f"http://127.0.0.1:{port}"
    p.wait_http(url + "/ready", 30)
    return p, url, "working tree"


NGINX_CONF = """worker_processes 1;
daemon off;
user root;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {work}/nginx-body;
  proxy_temp_path {work}/nginx-proxy;
  fastcgi_temp_path {work}/nginx-fcgi;
  uwsgi_temp_path {work}/nginx-uwsgi;
  scgi_temp_path {work}/nginx-scgi;
  upstream up {{ server {up}; keepalive 512; keepalive_requests 1000000; }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    keepalive_requests 1000000;
    location / {{
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 600s;
    }}
  }}
}}
"""


def nginx(work: Path, up: str, cpu: int, _: Path) -> tuple[Proc, str, str]:
    exe = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if exe is None and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "update"], capture_output=True, timeout=180)
        subprocess.run(["apt-get", "install", "-y", "nginx"], capture_output=True, timeout=300,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        exe = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if exe is None:
        raise Unavailable("nginx not installed (apt-get install -y nginx)")
    port = free_port()
    conf = work / "nginx.conf"
    conf.write_text(NGINX_CONF.format(work=work, up=up.removeprefix("http://"), port=port))
    p = Proc("nginx", [exe, "-c", str(conf), "-p", str(work)], work / "nginx.log", cpu)
    url = f"http://127.0.0.1:{port}"
    p.wait_http(url + "/health", 20)
    v = subprocess.run([exe, "-v"], capture_output=True, text=True).stderr.strip().split("/")[-1]
    return p, url, f"nginx {v} (Debian)"


def vllm_router(work: Path, up: str, cpu: int, venvs: Path) -> tuple[Proc, str, str]:
    exe = ensure_venv(venvs, "router", "vllm-router", "vllm-router")
    port = free_port()
    argv = [str(exe), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", up, "--policy", "round_robin",
            "--log-level", "warning", "--health-check-interval-secs", "60", "--disable-retries",
            "--disable-circuit-breaker", "--prometheus-port", str(free_port()), "--log-dir", str(work / "router-logs")]
    p = Proc("vllm-router", argv, work / "vllm-router.log", cpu, {"RUST_LOG": "warn"})
    url = f"http://127.0.0.1:{port}"
    p.wait_http(url + "/health", 60)
    return p, url, f"vllm-router {version(exe, 'vllm-router')} (PyPI)"


LITELLM_CONF = """model_list:
{models}
litellm_settings:
  telemetry: false
  drop_params: true
  turn_off_message_logging: true
  set_verbose: false
  json_logs: false
general_settings:
  disable_spend_logs: true
  disable_error_logs: true
  background_health_checks: false
"""


def litellm(work: Path, up: str, cpu: int, venvs: Path) -> tuple[Proc, str, str]:
    exe = ensure_venv(venvs, "litellm", "litellm[proxy]", "litellm", timeout=600)
    port = free_port()
    models = "\n".join(f"  - model_name: {m}\n    litellm_params:\n      model: openai/{m}\n"
                       f"      api_base: {up}/v1\n      api_key: none" for m in ("m", "paced"))
    conf = work / "litellm.yaml"
    conf.write_text(LITELLM_CONF.format(models=models))
    env = {"LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False", "LITELLM_MODE": "PRODUCTION",
           "DISABLE_ADMIN_UI": "True", "NO_DOCS": "True",
           "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true"}  # no auth, like the others
    p = Proc("litellm", [str(exe), "--config", str(conf), "--host", "127.0.0.1", "--port", str(port),
                         "--num_workers", "1"], work / "litellm.log", cpu, env, cwd=work)
    url = f"http://127.0.0.1:{port}"
    p.wait_http(url + "/health/liveliness", 120)
    return p, url, f"litellm {version(exe, 'litellm')} (PyPI, litellm[proxy])"


STARTERS: dict[str, Callable[[Path, str, int, Path], tuple[Proc, str, str]]] = {
    "gateway": gateway, "nginx": nginx, "vllm-router": vllm_router, "litellm": litellm,
}
