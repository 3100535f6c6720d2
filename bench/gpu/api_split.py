"""How an instance's load splits between its API server processes, over a pass's window.

``vllm serve --api-server-count N`` gives its N API server processes one listening socket
(vllm.entrypoints.cli.serve.run_multi_api_server), so each connection belongs to whichever process
accepted it, for its whole life. twin-api2's gateway side on instance b ran 62–166 tokens an
engine step in 4 of 8 windows (none of the other 22 windows below 185), b's two API servers had
used 190 and 246 s of CPU after the first four passes (even later), and the split of the
gateway's long-lived pool between them was not recorded. Here, at the window's start and end:
each connection to an instance's port, the process holding its server end and the process holding
its client end (``ss -tinp``: loopback shows both), what the server end sent, and each of the
instance's processes' CPU seconds. ``window()`` turns the two snapshots into, per instance and
API server process: its CPU in cores, and per client (gateway or direct) the connections it held,
those active (a byte either way in the last 2 s) and the MB it sent.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from bench_clients import cpu_seconds  # beside this file: the twin scripts run from here
from in_pass import descendants

ACTIVE_MS = 2000  # a stream sends at least every engine step; a waiting request has sent its body
_TCP = re.compile(r"(bytes_sent|bytes_received|lastsnd|lastrcv):(\d+)")
_PID = re.compile(r"pid=(\d+)")

Conn = tuple[int, int | None, int, int]  # server pid, client pid, bytes sent by the server end, ms idle


def _entries() -> list[tuple[str, str, int | None, dict[str, int]]]:
    """Every established TCP connection end: local address, peer address, owner PID, tcp_info."""
    if shutil.which("ss") is None:
        return []
    text = subprocess.run(["ss", "-tinpH", "state", "established"], capture_output=True, text=True,
                          timeout=20).stdout
    out: list[tuple[str, str, int | None, dict[str, int]]] = []
    for line in text.splitlines():
        if not line.startswith((" ", "\t")):  # an entry's first line; tcp_info follows, indented
            f = line.split()
            if len(f) >= 4:
                pid = _PID.search(line)
                out.append((f[2], f[3], int(pid.group(1)) if pid else None, {}))
        elif out:
            out[-1][3].update({k: int(v) for k, v in _TCP.findall(line)})
    return out


def snapshot(ports: dict[str, int], pids: dict[str, int]) -> dict[str, Any]:
    """Per instance (by name): its connections keyed by both ends, and its processes' CPU."""
    entries = _entries()
    owner = {local: pid for local, _, pid, _ in entries}
    conns: dict[str, dict[str, Conn]] = {name: {} for name in ports}
    by_port = {f":{port}": name for name, port in ports.items()}
    for local, peer, pid, info in entries:
        name = by_port.get(local[local.rfind(":"):])
        if name is not None and pid is not None:
            idle = min(info.get("lastsnd", 1 << 30), info.get("lastrcv", 1 << 30))
            conns[name][f"{local} {peer}"] = (pid, owner.get(peer), info.get("bytes_sent", 0), idle)
    cpu = {}
    for name, pid in pids.items():
        cpu[name] = {p: (_name(p), cpu_seconds(p)) for p in [pid, *descendants(pid)]}
    return {"conns": conns, "cpu": cpu, "ss": bool(entries)}


def _name(pid: int) -> str:
    """vLLM titles its processes (VLLM::APIServer_0, VLLM::EngineCore); else the command's start."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:40].strip()
    except OSError:
        return "?"


class Recorder(threading.Thread):
    """Takes ``snapshot`` at ``start`` and ``end`` (monotonic clock) beside the pass."""

    def __init__(self, ports: dict[str, int], pids: dict[str, int], start: float, end: float) -> None:
        super().__init__(daemon=True)
        self.ports, self.pids, self.start_at, self.end_at = ports, pids, start, end
        self.snaps: list[tuple[float, dict[str, Any]]] = []

    def run(self) -> None:
        for at in (self.start_at, self.end_at):
            time.sleep(max(0.0, at - time.monotonic()))
            self.snaps.append((time.monotonic(), snapshot(self.ports, self.pids)))

    def result(self, roles: dict[int, str]) -> dict[str, Any] | None:
        self.join(timeout=60)
        if len(self.snaps) < 2:
            return None
        (t0, before), (t1, after) = self.snaps
        return window(before, after, t1 - t0, roles)


def window(before: dict[str, Any], after: dict[str, Any], seconds: float,
           roles: dict[int, str]) -> dict[str, Any]:
    """Per instance: each of its processes' CPU in cores over the window, and per API server
    process and client role (``roles``: client PID to "gateway" / "direct"; anything else
    "other"): connections held at the end, those active then, and MB sent over the window (a
    connection opened inside it counts from zero)."""
    out: dict[str, Any] = {}
    for name, procs in after["cpu"].items():
        cores = {}
        for pid, (title, s1) in procs.items():
            s0 = before["cpu"].get(name, {}).get(pid, (title, None))[1]
            if s0 is not None and s1 is not None:
                cores[f"{title} {pid}"] = round((s1 - s0) / seconds, 3)
        servers: dict[str, dict[str, dict[str, float]]] = {}
        was = before["conns"].get(name, {})
        for key, (spid, cpid, sent, idle) in after["conns"].get(name, {}).items():
            role = roles.get(cpid, "other") if cpid is not None else "other"
            d = servers.setdefault(str(spid), {}).setdefault(role, {"conns": 0, "active": 0, "sent_mb": 0.0})
            d["conns"] += 1
            d["active"] += idle < ACTIVE_MS
            d["sent_mb"] += (sent - (was[key][2] if key in was else 0)) / 1e6
        for per_role in servers.values():
            for d in per_role.values():
                d["sent_mb"] = round(d["sent_mb"], 2)
        out[name] = {"cores": cores, "servers": servers}
    return {"instances": out, "ss": after["ss"]}
