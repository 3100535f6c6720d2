"""The gateway's own HTTP/1.1 upstream client (gateway/upstream.py, gateway/connection.py) against
raw asyncio servers on loopback: keep-alive reuse, a backend closing idle connections (and the
race of closing one just as a request goes out), chunked, content-length and close-delimited
bodies byte for byte, abort closing the connection, and a slow sink pausing the upstream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from gateway.connection import BrokenResponse, ConnectFailed, ResetBeforeResponse, UpstreamConnection
from gateway.upstream import UpstreamPool

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[bool]]


class Server:
    """A loopback server; ``handler(reader, writer, n)`` answers the n-th request of a connection
    and returns whether to keep the connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.closed_by_peer = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        n = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                n += 1
                if not await self.handler(reader, writer, n):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed_by_peer.set()
        finally:
            writer.close()


def _cl(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


async def _ok(_: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
    w.write(_cl(b'{"n": %d}' % n))
    await w.drain()
    return True


@pytest.fixture
async def pool() -> AsyncIterator[UpstreamPool]:
    p = UpstreamPool(connect_timeout_s=2)
    yield p
    p.close()


async def fetch(pool: UpstreamPool, url: str, body: bytes = b"{}") -> tuple[UpstreamConnection, bytes]:
    """One request through the pool, its body collected by a sink; the connection released."""
    loop = asyncio.get_running_loop()
    origin, request = pool.request(url, b"/v1/x", b"content-type: application/json\r\n", body)
    conn = await pool.send(origin, request, loop.time() + 5)
    got: list[bytes] = []
    conn.attach(lambda chunk: got.append(chunk) is None)
    assert await conn.body_end(5, loop.time() + 10)
    pool.release(conn, origin)
    return conn, b"".join(got)


async def test_keep_alive_connection_is_reused(pool: UpstreamPool) -> None:
    async with Server(_ok) as srv:
        for n in (1, 2, 3):
            conn, body = await fetch(pool, srv.url)
            assert (conn.status, body) == (200, b'{"n": %d}' % n)
        assert srv.connections == 1


async def test_pick_is_lifo_on_the_api_server_with_fewest_busy(pool: UpstreamPool) -> None:
    # Behind one port each API server process owns the connections it accepted. Plain LIFO kept the
    # busy set on one of them (twin-api2-split-h200x2); a random pick scattered requests over the whole
    # pool and their first tokens came late (twin-api2-balance-h200x2).
    async with Server(_ok) as srv:
        assert await pool.warm(srv.url, 8) == 8
        origin = pool._origin(srv.url)
        conns = sorted(origin.conns, key=id)
        served = {c.local: 101 if i < 4 else 202 for i, c in enumerate(conns) if c.local}
        assert pool.rebalance(srv.url, served, {101, 202}) == 0  # 4 / 4: nothing to even out
        assert origin.up == {101: 4, 202: 4} and pool.split(srv.url) == [4, 4]
        taken = [pool._take_idle(origin) for _ in range(4)]
        picked = [c.server for c in taken if c]
        assert sorted(picked) == [101, 101, 202, 202] and picked[0] != picked[1] and picked[2] != picked[3]
        first = taken[0]
        assert first is not None
        first.complete = first.keep_alive = True  # as after a response read to its end
        pool.release(first, origin)
        assert pool._take_idle(origin) is first  # most recently used on the least busy process
        # Sequential requests keep to one connection: the working set stays the streams'.
        conn, _ = await fetch(pool, srv.url)
        for _ in range(5):
            assert (await fetch(pool, srv.url))[0] is conn
        assert srv.connections == 8
        for c in taken[1:]:
            assert c is not None
            c.abort()


async def test_idle_connection_closed_by_the_backend_leaves_the_pool(pool: UpstreamPool) -> None:
    async def once(_: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
        await _ok(_, w, n)
        return False  # close after answering, without saying "connection: close" (a keep-alive timeout)

    async with Server(once) as srv:
        first, _ = await fetch(pool, srv.url)
        await asyncio.sleep(0.1)
        assert first.closed
        second, body = await fetch(pool, srv.url)
        assert second is not first and body == b'{"n": 1}'
        assert srv.connections == 2


async def test_reused_connection_closed_before_any_byte_is_retried_on_a_fresh_one(pool: UpstreamPool) -> None:
    async def stale(_: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
        if n == 2:
            return False  # read the request, then close without a byte: the keep-alive race
        return await _ok(_, w, n)

    async with Server(stale) as srv:
        await fetch(pool, srv.url)
        _, body = await fetch(pool, srv.url)  # goes out on the reused connection first
        assert body == b'{"n": 1}' and srv.connections == 2


async def test_fresh_connection_closed_before_any_byte_is_an_error(pool: UpstreamPool) -> None:
    async def drop(*_: object) -> bool:
        return False

    async with Server(drop) as srv:  # type: ignore[arg-type]
        with pytest.raises(ResetBeforeResponse):
            await fetch(pool, srv.url)


async def test_connect_refused_is_connect_failed(pool: UpstreamPool) -> None:
    srv = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    srv.close()
    await srv.wait_closed()
    with pytest.raises(ConnectFailed):
        await fetch(pool, f"http://127.0.0.1:{port}")


@pytest.mark.parametrize("framing", ["chunked", "content-length", "close"])
async def test_bodies_are_relayed_byte_for_byte(pool: UpstreamPool, framing: str) -> None:
    events = [b'data: {"i": %d, "pad": "%s"}\n\n' % (i, b"\xc3\xa9" * i) for i in range(200)]
    events.append(b"data: [DONE]\n\n")
    whole = b"".join(events)

    async def answer(_: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
        if framing == "chunked":
            w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            for e in events:
                w.write(b"%x\r\n%s\r\n" % (len(e), e))
                await w.drain()
            w.write(b"0\r\n\r\n")
        elif framing == "content-length":
            w.write(_cl(whole))
        else:
            w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n" + whole)
            await w.drain()
            return False
        await w.drain()
        return True

    async with Server(answer) as srv:
        conn, body = await fetch(pool, srv.url)
        assert body == whole
        assert conn.reusable() is False or framing != "close"
        conn2, body2 = await fetch(pool, srv.url)
        assert body2 == whole
        assert (conn2 is conn) == (framing != "close")


async def test_large_request_body_arrives_whole(pool: UpstreamPool) -> None:
    big = b"x" * (8 << 20)
    async with Server(_ok) as srv:  # Server reads exactly content-length bytes before answering
        conn, body = await fetch(pool, srv.url, big)
        assert body == b'{"n": 1}' and conn.status == 200
        _, body = await fetch(pool, srv.url)  # and the connection is still in step
        assert body == b'{"n": 2}' and srv.connections == 1


async def test_abort_mid_response_closes_the_connection_and_it_is_never_reused(pool: UpstreamPool) -> None:
    async def endless(_: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        while True:
            w.write(b"6\r\ndata: \r\n")
            await w.drain()
            await asyncio.sleep(0.01)

    loop = asyncio.get_running_loop()
    async with Server(endless) as srv:
        origin, request = pool.request(srv.url, b"/v1/x", b"", b"{}")
        conn = await pool.send(origin, request, loop.time() + 5)
        conn.attach(lambda chunk: True)
        with pytest.raises(TimeoutError):  # the total deadline strikes mid-body
            await conn.body_end(5, loop.time() + 0.2)
        pool.release(conn, origin)  # not complete: aborted, not pooled
        assert conn.closed and not any(origin.idle.values())
        await asyncio.wait_for(srv.closed_by_peer.wait(), 5)  # the backend saw the connection go


async def test_cancel_while_waiting_for_the_head_closes_the_connection(pool: UpstreamPool) -> None:
    eof = asyncio.Event()

    async def silent(r: asyncio.StreamReader, *_: object) -> bool:
        await r.read()  # never answers; returns at EOF
        eof.set()
        return False

    loop = asyncio.get_running_loop()
    async with Server(silent) as srv:  # type: ignore[arg-type]
        origin, request = pool.request(srv.url, b"/v1/x", b"", b"{}")
        task = asyncio.ensure_future(pool.send(origin, request, loop.time() + 30))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(eof.wait(), 5)
        assert not any(origin.idle.values())


async def test_each_request_on_a_reused_connection_times_out_at_its_own_head_deadline(pool: UpstreamPool) -> None:
    """A connection keeps one head timer across its requests (connection._arm_head): a request whose
    deadline is earlier than the live timer's gets it moved; a later one gets it moved on when it fires."""
    async def first_only(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
        if n == 1:
            return await _ok(r, w, n)
        await r.read()  # never answers the second; returns when the gateway gives up on it
        return False

    loop = asyncio.get_running_loop()
    for first_s, second_s in ((5.0, 0.3), (0.2, 0.6)):
        async with Server(first_only) as srv:
            origin, request = pool.request(srv.url, b"/v1/x", b"", b"{}")
            conn = await pool.send(origin, request, loop.time() + first_s)
            conn.attach(lambda chunk: True)
            assert await conn.body_end(5, loop.time() + 10)
            pool.release(conn, origin)
            start = loop.time()
            with pytest.raises(TimeoutError):
                await pool.send(origin, request, start + second_s)
            # Not before its own deadline, and not at the first request's 5 s (the bound is wide for
            # a loaded host).
            assert second_s - 0.02 <= loop.time() - start < second_s + 2.0
            assert conn.closed and srv.connections == 1


async def test_close_mid_body_is_a_broken_response(pool: UpstreamPool) -> None:
    async def short(_: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this")
        await w.drain()
        return False

    async with Server(short) as srv:
        with pytest.raises(BrokenResponse):
            await fetch(pool, srv.url)


async def test_slow_sink_pauses_the_upstream_and_nothing_is_lost(pool: UpstreamPool) -> None:
    chunk = b"y" * 16384
    total = 2000  # 32 MiB: far more than any socket buffer

    async def flood(_: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (len(chunk) * total))
        for _i in range(total):
            w.write(chunk)
            await w.drain()
        return True

    loop = asyncio.get_running_loop()
    async with Server(flood) as srv:
        origin, request = pool.request(srv.url, b"/v1/x", b"", b"{}")
        conn = await pool.send(origin, request, loop.time() + 5)
        got: list[bytes] = []

        def slow(data: bytes) -> bool:
            got.append(data)
            return False  # the client is slow after every chunk

        conn.attach(slow)
        pauses = 0
        while not await conn.body_end(5, loop.time() + 60):
            # Paused: the upstream is not read, and nothing reaches the sink while the "client" drains.
            pauses += 1
            assert conn.transport is not None and not conn.transport.is_reading()
            before = len(got)
            await asyncio.sleep(0.05 if pauses % 100 == 0 else 0)
            assert len(got) == before
            conn.resume()
        assert b"".join(got) == chunk * total and pauses >= 10
        pool.release(conn, origin)
        assert origin.idle == {0: [conn]}
