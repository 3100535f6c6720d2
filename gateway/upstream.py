"""The upstream side of the hot path: keep-alive pools of connection.py's connections, per backend.

A request takes the most recently used idle connection (LIFO) on the API server process with the
fewest busy connections of this pool, or opens one. Behind one port vLLM may run several API server
processes (``--api-server-count``) on one shared listening socket, each connection served for its
life by the process that accepted it; rebalance() learns which serves each (accept_split.py; until
then a connection counts as on process 0, and where it cannot tell, all do: plain LIFO).
- Plain LIFO kept the busy set on the hottest connections whatever the pool's split: 499 of 502
  busy connections on one API server, and that engine at a fifth of its tokens a step
  (bench/gpu/results/twin-api2-split-h200x2).
- A random pick (2026-11-28) spread them, but in windows without a skew 2-31 % of the gateway's
  requests waited over 1.2 s for their first token, against 0.1-1.1 % under LIFO and 0-2.7 % on
  the direct side (results/twin-api2-balance-h200x2): requests scattered over the whole pool (up to
  811 connections active in 2 s for 512 streams); LIFO keeps the working set to the streams'.
So LIFO within a process, and the process chosen by its busy count, which holds the busy split
even.

A connection goes back to the pool only when its response was read to the end and both sides keep
it alive; after a cancel, a timeout or any failure it is aborted, never reused mid-response. An idle
connection that the backend closes leaves the pool at once (connection_lost). When the backend
closes a reused connection just as a request goes out on it (the race no client can avoid), the
request fails with no response byte at all: that proves nothing was processed, so it is sent once
more on a fresh connection; the retry policy above never sees it.

``rebalance()`` evens the pool's own split over those processes out (accept_split.py): the
accepts decide it, and re-dials under load went 939 / 86 on two H200s.

``warm()`` opens connections ahead of requests (warm.py decides how many): under load vLLM's server
accepted a new connection only every 15-50 ms, so a burst that had to open its connections then
waited up to 2.4 s before vLLM read it, while requests on open connections were read in about 20 ms
(bench/gpu/results/serve-accept-1).
"""

from __future__ import annotations

import asyncio
import ssl
from urllib.parse import urlsplit

from gateway.accept_split import surplus
from gateway.connection import ConnectFailed, ResetBeforeResponse, UpstreamConnection

_MAX_IDLE = 4096  # per backend; the limiter bounds requests per backend, this bounds leftovers
_WARM_BATCH = 16  # connections warm() opens at once: a backend accepting them is never flooded


class Origin:
    """A backend base URL, parsed once: where to connect and what goes before the request's path."""

    __slots__ = ("conns", "dialled", "host", "idle", "port", "prefix", "request_line_tail", "split", "ssl", "up")

    def __init__(self, base: str) -> None:
        u = urlsplit(base)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {base}")
        self.ssl = u.scheme == "https"
        self.host = u.hostname
        self.port = u.port or (443 if self.ssl else 80)
        self.prefix = u.path.rstrip("/").encode("latin-1")
        netloc = u.netloc.rsplit("@", 1)[-1]
        self.request_line_tail = b" HTTP/1.1\r\nhost: " + netloc.encode("idna") + b"\r\ncontent-length: "
        self.idle: dict[int, list[UpstreamConnection]] = {}  # API server pid (0: not known) → idle, oldest first
        self.up: dict[int, int] = {}  # API server pid → connections up there, idle or busy (same keys)
        self.conns: set[UpstreamConnection] = set()  # connections up, idle or busy
        self.dialled = 0  # connections opened so far: the warmer looks at the split again when it moves
        self.split: list[int] = []  # connections per API server behind the port, as rebalance() last read it

    def add(self, conn: UpstreamConnection) -> None:
        """A connection just opened: up, on a process not known yet (0) until rebalance() reads it."""
        self.dialled += 1
        self.conns.add(conn)
        self.up[0] = self.up.get(0, 0) + 1
        self.idle.setdefault(0, [])


class UpstreamPool:
    def __init__(self, connect_timeout_s: float) -> None:
        self.connect_timeout_s = connect_timeout_s
        self._origins: dict[str, Origin] = {}
        self._ssl: ssl.SSLContext | None = None
        self._closed = False

    def request(self, base: str, target: bytes, headers: bytes, body: bytes) -> tuple[Origin, list[bytes]]:
        """The request's bytes for backend ``base``: ``headers`` is a block of ``name: value\\r\\n``
        lines (never host or content-length, which are set here)."""
        origin = self._origins.get(base) or self._origin(base)  # the lookup alone on the hot path
        head = b"POST %s%s%s%d\r\n%s\r\n" % (origin.prefix, target, origin.request_line_tail, len(body), headers)
        return origin, [head, body] if body else [head]

    async def send(self, origin: Origin, request: list[bytes], head_deadline: float) -> UpstreamConnection:
        """A connection whose response head is in. Raises connection.UpstreamError or TimeoutError;
        on any failure (or cancel) the connection is closed."""
        conn = self._take_idle(origin)
        if conn is not None:
            # _exchange's steps, inline: the path of nearly every request, one coroutine fewer.
            conn.start(request)
            try:
                await conn.response_head(head_deadline)
            except BaseException as e:
                conn.abort()
                if not isinstance(e, ResetBeforeResponse) or conn.received:
                    raise
                # A keep-alive connection closed under us before any byte came back: go again, fresh.
            else:
                return conn
        conn = await self._connect(origin)
        return await self._exchange(conn, request, head_deadline)

    @staticmethod
    async def _exchange(conn: UpstreamConnection, request: list[bytes], head_deadline: float) -> UpstreamConnection:
        conn.start(request)
        try:
            await conn.response_head(head_deadline)
        except BaseException:
            conn.abort()
            raise
        return conn

    def _origin(self, base: str) -> Origin:
        origin = self._origins.get(base)
        if origin is None:
            origin = self._origins[base] = Origin(base)
        return origin

    def counts(self, base: str) -> dict[str, int]:
        """This process's connections to ``base``: up (idle or busy), and idle (for /fleet)."""
        origin = self._origins.get(base)
        if origin is None:
            return {"open": 0, "idle": 0}
        return {"open": len(origin.conns), "idle": sum(map(len, origin.idle.values()))}

    def split(self, base: str) -> list[int]:
        """This pool's connections to ``base`` per process accepting on its port, most first, as
        rebalance() last read them ([] where it could not tell: another host, no permission)."""
        origin = self._origins.get(base)
        return origin.split if origin else []

    def dialled(self, base: str) -> tuple[int, int] | None:
        """``base``'s port, and how many connections were opened to it so far."""
        origin = self._origins.get(base)
        return (origin.port, origin.dialled) if origin else None

    def rebalance(self, base: str, served: dict[tuple[str, int], int], accepting: set[int]) -> int | None:
        """Note which process serves each connection to ``base`` (accept_split.py: ``served`` maps a
        connection's local address to it), then close idle connections on processes that hold more
        than their share of this pool; warm() dials them again. Returns how many were closed; None
        where the split is not known yet (a connection not accepted yet has no process): read it again."""
        origin = self._origins.get(base)
        if origin is None:
            return 0
        held = dict.fromkeys(accepting, 0)
        for conn in origin.conns:
            pid = served.get(conn.local) if conn.local else None
            if pid in held:
                held[pid] += 1
                conn.server = pid
        _regroup(origin)
        origin.split = sorted(held.values(), reverse=True)
        if len(accepting) < 2:
            return 0  # one process (or none seen): nothing to even out
        if sum(held.values()) < len(origin.conns):
            return None
        closed = 0
        for pid, n in surplus(held, accepting).items():
            idle = origin.idle.get(pid, [])
            for conn in idle[:n]:  # the least recently used
                origin.conns.discard(conn)  # off the pool now, not when connection_lost comes: warm() redials at once
                origin.up[pid] -= 1
                conn.abort()
                closed += 1
            del idle[:n]
        return closed

    async def warm(self, base: str, n: int, batch: int = _WARM_BATCH) -> int:
        """Open connections to ``base`` until ``n`` are up (idle or busy), ``batch`` at a time, into
        the idle pool. Returns how many are up; stops at the first batch with a failure (the probes
        will tell why), and after ``n`` tries (a backend that closes what it accepts is not dialled in a loop)."""
        origin = self._origin(base)
        tries = 0
        while not self._closed and len(origin.conns) < n and tries < n:
            k = min(batch, n - len(origin.conns), n - tries)
            tries += k
            got = await asyncio.gather(*(self._connect(origin) for _ in range(k)), return_exceptions=True)
            conns = [c for c in got if isinstance(c, UpstreamConnection)]
            if self._closed:
                for c in conns:
                    c.abort()
            else:
                origin.idle.setdefault(0, []).extend(conns)
            if len(conns) < len(got):
                break
        return len(origin.conns)

    def release(self, conn: UpstreamConnection, origin: Origin) -> None:
        """The request is over: keep the connection only if its response was read to a clean end."""
        idle = origin.idle.get(conn.server)
        if not self._closed and idle is not None and conn.reusable() and len(idle) < _MAX_IDLE:
            conn.idle()
            idle.append(conn)
        else:
            conn.abort()

    def close(self) -> None:
        self._closed = True
        for origin in self._origins.values():
            idle, origin.idle = origin.idle, {}
            for conns in idle.values():
                for conn in conns:
                    conn.abort()

    @staticmethod
    def _take_idle(origin: Origin) -> UpstreamConnection | None:
        """The most recently used idle connection on the process with the fewest busy ones."""
        while True:
            best: list[UpstreamConnection] | None = None
            least = 0
            for pid, idle in origin.idle.items():  # one entry, two or three: never many
                if idle and (best is None or origin.up[pid] - len(idle) < least):
                    best, least = idle, origin.up[pid] - len(idle)
            if best is None:
                return None
            conn = best.pop()
            if not conn.closed:
                return conn

    async def _connect(self, origin: Origin) -> UpstreamConnection:
        loop = asyncio.get_running_loop()

        def lost(conn: UpstreamConnection) -> None:
            if conn in origin.conns:  # absent if a timeout closed it as it came up, or rebalance() did
                origin.conns.discard(conn)
                origin.up[conn.server] -= 1
            idle = origin.idle.get(conn.server)
            if idle is not None and conn in idle:
                idle.remove(conn)

        tls: ssl.SSLContext | None = None
        if origin.ssl:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            tls = self._ssl
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(lambda: UpstreamConnection(loop, lost), origin.host, origin.port,
                                                       ssl=tls, server_hostname=origin.host if tls else None)
        except (OSError, TimeoutError, ssl.SSLError) as e:
            raise ConnectFailed(f"{origin.host}:{origin.port}: {e.__class__.__name__}: {e}") from e
        origin.add(conn)
        return conn


def _regroup(origin: Origin) -> None:
    """After connections' ``server`` changed: count and file them again by it, idle ones in the
    order they were in; a process with none left leaves the pick's loop."""
    up: dict[int, int] = {}
    for conn in origin.conns:
        up[conn.server] = up.get(conn.server, 0) + 1
    idle: dict[int, list[UpstreamConnection]] = {pid: [] for pid in up}
    for conns in origin.idle.values():
        for conn in conns:
            if conn in origin.conns:
                idle[conn.server].append(conn)
    origin.up, origin.idle = up, idle
