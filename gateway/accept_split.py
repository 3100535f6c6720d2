"""Which process on this host serves each upstream connection, and how many to give up to even that out.

vLLM's ``--api-server-count N`` runs N API server processes on one shared listening socket; the
kernel gives each new connection to whichever of them accepts first, and that process serves it for
its life. A burst of dials while one API server is busy lands nearly all on the other: after the
gateway re-opened the connections a client's cancelled streams had closed, one instance's pool sat
939 / 86 on its two API servers, the gateway's busy streams 518 / 2, and that engine ran 72 tokens a
step against its twin's 229 (bench/gpu/results/twin-api2-random-h200x2). The pool's pick
(upstream.py) sends each request to the process with the fewest busy connections, but only while
that process holds an idle one: the split itself has to be even. The same read tells the pick
which process serves each connection.

The kernel says where each connection went: ``/proc/net/tcp`` (and ``tcp6``) gives the inode of the
server end of each connection to a port, ``/proc/PID/fd`` which process holds that inode. That only
works on one host and in one network namespace, with permission to read the server's ``/proc/PID/fd``
(same user, or root): anywhere else ``read()`` finds nothing and the pool is left as it is.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable

_LISTEN = "0A"
_ESTABLISHED = "01"
_TABLES = ("net/tcp", "net/tcp6")
TOLERANCE = 0.15  # a process may hold this much over its even share before connections move
MIN_MOVE = 4  # fewer surplus connections than this are not worth a re-dial


def _addr(field: str) -> tuple[str, int]:
    """``0100007F:1F41`` → ``("127.0.0.1", 8001)``; IPv4-mapped IPv6 addresses as IPv4."""
    host, port = field.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip = socket.inet_ntop(socket.AF_INET, raw[::-1])  # one 32-bit word in the host's (little-endian) order
    else:
        ip = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
        ip = ip.removeprefix("::ffff:")
    return ip, int(port, 16)


class ServerEnds:
    """Reads, for some ports, which process holds the server end of each connection to them.
    Blocking (``/proc`` reads): the warmer calls it in a thread."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self._holders: dict[frozenset[int], list[int]] = {}  # a port's listening inodes → processes holding them

    def read(self, ports: Iterable[int]) -> dict[int, tuple[dict[tuple[str, int], int], set[int]]]:
        """Per port: {client address: pid of the process serving it}, and the processes accepting
        on the port (those holding its listening socket that are not the parent of another: vLLM's
        launcher keeps the socket it handed to its API servers but accepts nothing)."""
        wanted = set(ports)
        listening: dict[int, set[int]] = {}
        ends: dict[int, dict[int, tuple[str, int]]] = {}  # port → server end's inode → client address
        for table in _TABLES:
            try:
                with open(os.path.join(self.proc, table)) as f:
                    next(f, None)
                    for line in f:
                        fields = line.split()
                        local = fields[1]
                        port = int(local[local.rindex(":") + 1:], 16)
                        if port not in wanted:
                            continue
                        if fields[3] == _LISTEN:
                            listening.setdefault(port, set()).add(int(fields[9]))
                        elif fields[3] == _ESTABLISHED and fields[9] != "0":
                            ends.setdefault(port, {})[int(fields[9])] = _addr(fields[2])
            except OSError:
                continue
        out: dict[int, tuple[dict[tuple[str, int], int], set[int]]] = {}
        for port, inodes in listening.items():
            holders = self._holding(frozenset(inodes))
            if not holders:
                continue
            owner = self._owners(holders)
            served = {client: owner[ino] for ino, client in ends.get(port, {}).items() if ino in owner}
            out[port] = (served, self._accepting(holders))
        return out

    def _holding(self, inodes: frozenset[int]) -> list[int]:
        """The processes holding these listening sockets: every process's fds are read once per
        socket (a restart makes new ones), then only theirs."""
        holders = self._holders.get(inodes)
        if holders is not None and all(os.path.exists(os.path.join(self.proc, str(p))) for p in holders):
            return holders
        wanted = {f"socket:[{i}]" for i in inodes}
        pids = [int(d) for d in os.listdir(self.proc) if d.isdigit()]
        holders = [p for p in pids if wanted & set(self._links(p))]
        if len(self._holders) > 64:  # old sockets of instances that restarted
            self._holders.clear()
        self._holders[inodes] = holders
        return holders

    def _owners(self, pids: list[int]) -> dict[int, int]:
        """Socket inode → the process holding it, among ``pids``."""
        owner: dict[int, int] = {}
        for pid in pids:
            for link in self._links(pid):
                if link.startswith("socket:["):
                    owner[int(link[8:-1])] = pid
        return owner

    def _accepting(self, holders: list[int]) -> set[int]:
        parents = {self._ppid(p) for p in holders}
        return {p for p in holders if p not in parents}

    def _ppid(self, pid: int) -> int:
        try:
            with open(os.path.join(self.proc, str(pid), "stat")) as f:
                return int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return 0

    def _links(self, pid: int) -> list[str]:
        fd_dir = os.path.join(self.proc, str(pid), "fd")
        try:
            names = os.listdir(fd_dir)
        except OSError:  # gone, or not ours to read
            return []
        links = []
        for name in names:
            try:
                links.append(os.readlink(os.path.join(fd_dir, name)))
            except OSError:
                continue
        return links


def surplus(held: dict[int, int], accepting: set[int]) -> dict[int, int]:
    """How many of its connections each process should give up so that the pool's ``held``
    (pid → connections) comes within TOLERANCE of an even split over ``accepting``."""
    if len(accepting) < 2:
        return {}
    total = sum(held.get(p, 0) for p in accepting)
    share = total / len(accepting)
    out = {}
    for pid in accepting:
        extra = held.get(pid, 0) - share
        if held.get(pid, 0) > share * (1 + TOLERANCE) and extra >= MIN_MOVE:
            out[pid] = int(extra)
    return out
