"""How an instance's load splits between its API server processes, over a pass's window.

``vllm serve --api-server-count N`` gives its N API server processes one listening socket
(vllm.entrypoints.cli.serve.run_multi_api_server), so each connection belongs to whichever process
accepted it, for its whole life. twin-api2's gateway side on instance b ran 62–166 tokens an
engine step in 4 of 8 windows (none of the other 22 windows below 185), b's two API servers had
used 190 and 246 s of CPU after the first four passes (even later), and the split of the
gateway's long-lived pool between them was not recorded. Here, at the window's start and end:
each connection to an instance's port, the process holding its server end and the process holding
its client end (the kernel's sock_diag: loopback shows both), what the server end sent, and
each of the instance's processes' CPU seconds. ``window()`` turns the two snapshots into, per instance and
API server process: its CPU in cores, and per client (gateway or direct) the connections it held,
those active (a byte either way in the last 2 s) and the MB it sent. twin_pairs.py records it in
each row (``api_split``); ``main`` prints each window's split and how the skewed ones went:

    (cd bench/gpu && python3 api_split.py results/twin-api2-split-h200x2/rows.json.gz)
"""

from __future__ import annotations

import os
import socket
import statistics
import struct
import threading
import time
from pathlib import Path
from typing import Any

from bench_clients import cpu_seconds  # beside this file: the twin scripts run from here
from in_pass import descendants

# A stream sends at least every engine step. A request waiting longer for its first token counts
# idle: that undercounts an overloaded API server's share, never inflates it.
ACTIVE_MS = 2000
POOLS = ("gateway", "random")  # the roles a gateway's connections take (pick_pairs.py's random pick: "random")
_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY, _INET_DIAG_INFO, _TCP_ESTABLISHED = 4, 20, 2, 1
_NLMSG_ERROR, _NLMSG_DONE = 2, 3

Conn = tuple[int, int | None, int, int]  # server pid, client pid, bytes sent by the server end, ms idle


def _sockets() -> dict[int, int]:
    """Socket inode to the PID holding it, over every process this user can read."""
    out: dict[int, int] = {}
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        pid = int(fd_dir.parent.name)
        try:
            fds = list(fd_dir.iterdir())
        except OSError:
            continue  # gone, or not ours to read
        for fd in fds:
            try:
                link = os.readlink(fd)
            except OSError:
                continue  # closed since (the listing's own descriptor is)
            if link.startswith("socket:["):
                out[int(link[8:-1])] = pid
    return out


def _entries() -> list[tuple[str, str, int | None, dict[str, int]]]:
    """Every established IPv4 TCP connection end: local address, peer address, owner PID, and from
    its tcp_info the bytes acked (sent), ms since data was last sent and received. Through the
    kernel's sock_diag netlink interface, as ``ss -ti`` reads it (the GPU machines have no ss)."""
    nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG)
    try:
        req = struct.pack("=BBBxI", socket.AF_INET, socket.IPPROTO_TCP, 1 << (_INET_DIAG_INFO - 1),
                          1 << _TCP_ESTABLISHED) + bytes(48)
        nl.sendall(struct.pack("=IHHII", 16 + len(req), _SOCK_DIAG_BY_FAMILY, 0x301, 1, 0) + req)
        raw: list[tuple[str, str, int, dict[str, int]]] = []
        while True:
            data = nl.recv(1 << 20)
            off = 0
            while off < len(data):
                length, kind = struct.unpack_from("=IH", data, off)
                if kind in (_NLMSG_DONE, _NLMSG_ERROR):
                    return _owned(raw)
                raw.append(_diag(data, off + 16, off + length))
                off += (length + 3) & ~3
    finally:
        nl.close()


def _diag(data: bytes, off: int, end: int) -> tuple[str, str, int, dict[str, int]]:
    sport, dport = struct.unpack_from("!HH", data, off + 4)
    src, dst = socket.inet_ntoa(data[off + 8:off + 12]), socket.inet_ntoa(data[off + 24:off + 28])
    inode = struct.unpack_from("=I", data, off + 68)[0]
    info: dict[str, int] = {}
    at = off + 72
    while at + 4 <= end:
        alen, atype = struct.unpack_from("=HH", data, at)
        if atype == _INET_DIAG_INFO and alen >= 4 + 136:  # tcp_info through tcpi_bytes_received
            info["lastsnd"], info["lastrcv"] = struct.unpack_from("=I4xI", data, at + 4 + 44)
            info["bytes_sent"] = struct.unpack_from("=Q", data, at + 4 + 120)[0]  # tcpi_bytes_acked
        at += (alen + 3) & ~3
    return f"{src}:{sport}", f"{dst}:{dport}", inode, info


def _owned(raw: list[tuple[str, str, int, dict[str, int]]]) -> list[tuple[str, str, int | None, dict[str, int]]]:
    owners = _sockets()
    return [(local, peer, owners.get(inode), info) for local, peer, inode, info in raw]


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
    return {"conns": conns, "cpu": cpu, "seen": len(entries)}


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
    return {"instances": out, "seen": after["seen"]}


def windows(rows: list[dict[str, Any]], late_ms: float = 1200.0) -> list[dict[str, Any]]:
    """Each side of each pass with a split: its path, tokens an engine step, TTFT p50, the share of
    its requests whose first token took over ``late_ms``, and per API server process (busier first,
    by the side's active connections): active, held, and the gateway's pool held there (the gateway
    keeps one to both instances), and its CPU in cores."""
    out = []
    for r in rows:
        split = r.get("api_split")
        if not split:
            continue
        for path, side in r["sides"].items():
            role, inst = path.split(":")
            got = split["instances"][inst]
            cores = {title.rsplit(" ", 1)[1]: c for title, c in got["cores"].items()}
            procs = sorted(((d.get(role, {}).get("active", 0), d.get(role, {}).get("conns", 0),
                             d.get("gateway", {}).get("conns", 0), cores.get(pid))
                            for pid, d in got["servers"].items()), reverse=True)
            active = sum(p[0] for p in procs)
            ttfts = [t for second in side["ttft_ms_each_second"] for t in second]
            out.append({"pass": r["pass"], "kind": r["kind"], "path": path,
                        "tokens_per_step": r["engine"][path]["tokens_per_step"], "ttft_p50": side["median_ttft_ms"],
                        "late": sum(t > late_ms for t in ttfts) / len(ttfts) if ttfts else 0.0,
                        "procs": procs, "busier_share": procs[0][0] / active if active else None})
    return out


def main(argv: list[str] | None = None) -> None:
    import argparse
    import gzip
    import json

    ap = argparse.ArgumentParser(description="each window's split between its instance's API servers")
    ap.add_argument("rows", nargs="+")
    ap.add_argument("--collapse", type=float, default=185.0, help="tokens an engine step below which a window counts")
    ap.add_argument("--skew", type=float, default=0.8, help="busier API server's share of active connections")
    ap.add_argument("--late-ms", type=float, default=1200.0, help="a first token later than this counts as late")
    ap.add_argument("--even", type=float, default=0.65,
                    help="the direct side's busier share at or below which its split counts as even")
    a = ap.parse_args(argv)
    rows = [r for f in a.rows for r in json.loads((gzip.open if f.endswith(".gz") else open)(f, "rt").read())]
    got = windows(rows, a.late_ms)
    print("| pass | side | tokens a step | TTFT p50 ms | active: busier / other | held | gateway's pool there | "
          f"API servers' cores | TTFT > {a.late_ms:g} ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for w in got:
        p = w["procs"]
        print(f"| {w['pass']} {w['kind']} | {w['path']} | {w['tokens_per_step']:.0f} | {w['ttft_p50']:.0f} | "
              f"{' / '.join(str(x[0]) for x in p)} | {' / '.join(str(x[1]) for x in p)} | "
              f"{' / '.join(str(x[2]) for x in p)} | {' / '.join(f'{x[3]:.2f}' for x in p if x[3] is not None)} | "
              f"{w['late']:.1%} |")
    print(f"\n| side | windows | busier share ≥ {a.skew} | of those below {a.collapse:.0f} tokens a step | "
          "others below it |")
    print("|---|---|---|---|---|")
    roles = [role for role in ("direct", *POOLS) if any(w["path"].startswith(role + ":") for w in got)]
    for role in roles:
        mine = [w for w in got if w["path"].startswith(role)]
        skewed = [w for w in mine if (w["busier_share"] or 0) >= a.skew]
        rest = [w for w in mine if w not in skewed]
        print(f"| {role} | {len(mine)} | {len(skewed)} | {sum(w['tokens_per_step'] < a.collapse for w in skewed)} | "
              f"{sum(w['tokens_per_step'] < a.collapse for w in rest)} of {len(rest)} |")
    print(f"\n| side | busier share | windows | share of requests with TTFT > {a.late_ms:g} ms: median (range) |")
    print("|---|---|---|---|")
    for role in roles:
        for label, want in (("≥ " + str(a.skew), True), ("below", False)):
            late = sorted(w["late"] for w in got if w["path"].startswith(role)
                          and ((w["busier_share"] or 0) >= a.skew) is want)
            if late:
                mid = statistics.median(late)
                print(f"| {role} | {label} | {len(late)} | {mid:.1%} ({late[0]:.1%}–{late[-1]:.1%}) |")
    # each pass's gateway side against its direct side (two GPUs: not a swap pair), by the gateway's skew,
    # then by the direct side's: the kernel splits a direct client's connections, so it can be the skewed one
    share = {(w["pass"], w["path"].split(":")[0]): w["busier_share"] or 0.0 for w in got}
    two = [r for r in rows if r.get("api_split") and len(r["sides"]) == 2]  # pick_pairs.py's passes have one side
    if not two:
        return
    print("\n| split | passes | gateway ÷ direct in the same pass, median (range): tokens/s | TTFT p50 |")
    print("|---|---|---|---|")
    groups = ((f"gateway's busier API server ≥ {a.skew}", "gateway", lambda x: x >= a.skew),
              ("gateway's below", "gateway", lambda x: x < a.skew),
              (f"direct's busier API server ≤ {a.even}", "direct", lambda x: x <= a.even),
              ("direct's above", "direct", lambda x: x > a.even))
    for label, role, want in groups:
        ratios = [_ratios(r) for r in two if (r["pass"], role) in share and want(share[r["pass"], role])]
        if ratios:
            tok, ttft = sorted(x[0] for x in ratios), sorted(x[1] for x in ratios)
            print(f"| {label} | {len(ratios)} | {statistics.median(tok):.3f} ({tok[0]:.3f}–{tok[-1]:.3f}) | "
                  f"{statistics.median(ttft):.3f} ({ttft[0]:.3f}–{ttft[-1]:.3f}) |")


def _ratios(row: dict[str, Any]) -> tuple[float, float]:
    g, d = (next(s for p, s in row["sides"].items() if p.startswith(role)) for role in ("gateway", "direct"))
    return g["output_throughput"] / d["output_throughput"], g["median_ttft_ms"] / d["median_ttft_ms"]


if __name__ == "__main__":
    main()
